"""An Idefics3 / SmolVLM HF folder -> llama.cpp's pair of GGUF files, as its `convert_hf_to_gguf.py`
writes them: the decoder as an ordinary `llama` GGUF (SmolLM2's BPE vocabulary with the image
tokens, the chat template; the `--mmproj`-less run) and the vision tower and connector as a `clip`
GGUF of type `mmproj` (`--mmproj`: `v.*` and `mm.model.fc` tensors, `clip.vision.*` keys, projector
type `idefics3`). Names come from gguf-py's own tensor map, the Q/K rows get llama.cpp's RoPE
permutation, and the folder is read with kvserve's own config rules, so both sides agree on every
default. `scripts/hf_to_gguf_pair.py` is the command line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, NamedTuple

import gguf
import numpy as np
import torch

from kvserve.models.config import ModelArchConfig, arch_config_from_hf
from kvserve.models.loader.safetensors import iter_safetensors
from kvserve.models.loader.tokenizer import load_hf_tokenizer
from kvserve.models.vision.config import VisionArchConfig
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig

OutType = Literal["f32", "f16"]
_FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
_TEXT_PREFIX, _VISION_PREFIXES = "model.text_model.", ("model.vision_model.", "model.connector.")


class GGUFPair(NamedTuple):
    language: Path
    mmproj: Path


def write_gguf_pair(
    folder: Path, out_dir: Path, *, outtype: OutType = "f32", tokenizer_pre: str = "smollm"
) -> GGUFPair:
    """Write `{name}-{TYPE}.gguf` and `mmproj-{name}-{TYPE}.gguf` into `out_dir` for the folder.
    `tokenizer_pre` is llama.cpp's pre-tokenizer name, which its converter finds by hashing the
    tokenizer's output on a test text: "smollm" for SmolVLM's SmolLM2 vocabulary."""
    folder, out_dir = Path(folder), Path(out_dir)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") not in ("idefics3", "smolvlm"):
        raise ValueError(f"{folder}: model_type {config.get('model_type')!r} is not Idefics3 / SmolVLM")
    arch = arch_config_from_hf({**config, "model_type": "idefics3"})
    assert arch.vision is not None
    if arch.rope_scaling is not None:
        raise ValueError(f"{folder}: writing RoPE scaling {arch.rope_scaling} is not supported")
    text, vision = _split_tensors(iter_safetensors(folder))
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{folder.name}-{outtype.upper()}"
    pair = GGUFPair(out_dir / f"{name}.gguf", out_dir / f"mmproj-{name}.gguf")
    _write_language(pair.language, folder, arch, text, outtype, tokenizer_pre)
    processor = Idefics3ProcessorConfig.from_folder(folder)
    write_mmproj(pair.mmproj, folder.name, arch.vision, arch.hidden_size, processor, vision, outtype)
    return pair


def _split_tensors(
    tensors: Iterator[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """HF names -> (decoder tensors under LlamaForCausalLM's names, vision tensors as they are)."""
    text, vision = {}, {}
    for name, tensor in tensors:
        if name.startswith(_VISION_PREFIXES):
            vision[name] = tensor
        else:
            text["model." + name.removeprefix(_TEXT_PREFIX) if name.startswith(_TEXT_PREFIX) else name] = (
                tensor
            )
    return text, vision


def _write_language(
    path: Path,
    folder: Path,
    arch: ModelArchConfig,
    tensors: dict[str, torch.Tensor],
    outtype: OutType,
    tokenizer_pre: str,
) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(folder.name)
    writer.add_file_type(_FILE_TYPES[outtype])
    writer.add_context_length(arch.max_position_embeddings)
    writer.add_embedding_length(arch.hidden_size)
    writer.add_block_count(arch.num_hidden_layers)
    writer.add_feed_forward_length(arch.intermediate_size)
    writer.add_head_count(arch.num_attention_heads)
    writer.add_head_count_kv(arch.num_key_value_heads)
    writer.add_layer_norm_rms_eps(arch.rms_norm_eps)
    writer.add_rope_freq_base(arch.rope_theta)
    writer.add_rope_dimension_count(arch.head_dim)
    writer.add_vocab_size(arch.vocab_size)
    _write_vocab(writer, folder, arch.vocab_size, tokenizer_pre)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, arch.num_hidden_layers)
    for hf_name, tensor in tensors.items():
        if hf_name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # llama.cpp reads a missing output.weight as tied
        values = tensor.float().numpy()
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{folder}: no GGUF name for decoder tensor {hf_name!r}")
        if ".attn_q." in gguf_name or ".attn_k." in gguf_name:
            heads = arch.num_attention_heads if ".attn_q." in gguf_name else arch.num_key_value_heads
            values = _permute_for_llama_rope(values, heads)
        _add_tensor(writer, gguf_name, values, outtype)
    _finish(writer)


def _permute_for_llama_rope(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: llama.cpp's RoPE pairs adjacent rows, HF's the
    two halves of a head (loader/gguf.py undoes it)."""
    per_head = weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weights.shape)


def _write_vocab(writer: gguf.GGUFWriter, folder: Path, vocab_size: int, tokenizer_pre: str) -> None:
    """convert_hf_to_gguf's `_set_vocab_gpt2`: tokens by id (added special tokens CONTROL, other
    added tokens USER_DEFINED, ids past the tokenizer's `[PAD{i}]`), merges, special ids, whether
    to add a BOS, and the chat template through gguf-py's SpecialVocab."""
    info = load_hf_tokenizer(folder)
    tokenizer = info.tokenizer
    if json.loads((folder / "tokenizer.json").read_text())["model"]["type"] != "BPE":
        raise ValueError(f"{folder}: only BPE (gpt2-style) vocabularies are written")
    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens))
    # Said even where the folder's files leave it implicit: llama.cpp adds a BOS to a gpt2
    # vocabulary that does not say, which SmolVLM's prompts do not have.
    special.add_special_token.setdefault("bos", info.add_bos_token)
    special.add_to_gguf(writer)


def write_mmproj(
    path: Path,
    name: str,
    vision: VisionArchConfig,
    text_hidden_size: int,
    processor: Idefics3ProcessorConfig,
    tensors: dict[str, torch.Tensor],
    outtype: OutType,
) -> None:
    """MmprojModel.set_gguf_parameters + SmolVLMModel's: the keys llama.cpp's clip.cpp reads."""
    if vision.hidden_act != "gelu_pytorch_tanh":
        raise ValueError(f"{name}: clip.cpp's idefics3 encoder runs gelu (tanh), not {vision.hidden_act}")
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_name(name)
    writer.add_file_type(_FILE_TYPES[outtype])
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text_hidden_size)
    writer.add_vision_image_size(vision.image_size)
    writer.add_vision_patch_size(vision.patch_size)
    writer.add_vision_embedding_length(vision.hidden_size)
    writer.add_vision_feed_forward_length(vision.intermediate_size)
    writer.add_vision_block_count(vision.num_hidden_layers)
    writer.add_vision_head_count(vision.num_attention_heads)
    writer.add_vision_image_mean(list(processor.image_mean))
    writer.add_vision_image_std(list(processor.image_std))
    writer.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    writer.add_vision_attention_layernorm_eps(vision.layer_norm_eps)
    writer.add_vision_projector_scale_factor(vision.scale_factor)
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(processor.longest_edge)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision.num_hidden_layers)
    for hf_name, tensor in tensors.items():
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{name}: no GGUF name for vision tensor {hf_name!r}")
        # SmolVLMModel.tensor_force_quant: the patch and position embeddings stay f32.
        kept = "f32" if ".embeddings." in hf_name else outtype
        _add_tensor(writer, gguf_name, tensor.float().numpy(), kept)
    _finish(writer)


def _add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, outtype: OutType) -> None:
    """1-D tensors (norms, biases) in f32 as llama.cpp keeps them; the rest in `outtype`. The
    patch embedding stays a 4-D [hidden, channels, patch, patch] tensor (ggml's conv kernel order
    reversed, which is how GGUF stores every shape)."""
    is_f16 = outtype == "f16" and values.ndim > 1
    writer.add_tensor(name, values.astype(np.float16 if is_f16 else np.float32))


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
