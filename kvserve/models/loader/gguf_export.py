"""An Idefics3 / SmolVLM or Qwen2.5-VL HF folder -> llama.cpp's pair of GGUF files, as its
`convert_hf_to_gguf.py` writes them: the decoder as an ordinary language GGUF (the `--mmproj`-less
run: `llama` for SmolVLM; `qwen2vl`, with its M-RoPE sections, for Qwen2.5-VL; the BPE vocabulary
with the image tokens, the chat template) and the vision tower and connector as a `clip` GGUF of
type `mmproj` (`--mmproj`: projector type `idefics3`, or `qwen2.5vl_merger` with the Conv3d patch
embedding split per frame and the fused QKV split). Names come from gguf-py's own tensor map, the
`llama` Q/K rows get llama.cpp's RoPE permutation, and the folder is read with kvserve's own config
rules, so both sides agree on every default. `scripts/hf_to_gguf_pair.py` is the command line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
import torch

from kvserve.models.config import ModelArchConfig, arch_config_from_hf
from kvserve.models.loader.gguf_write import FILE_TYPES, OutType, add_tensor, finish
from kvserve.models.loader.mmproj_export import write_mmproj, write_qwen2_5_vl_mmproj
from kvserve.models.loader.safetensors import iter_safetensors
from kvserve.models.loader.tokenizer import load_hf_tokenizer
from kvserve.models.vision.config import Qwen2_5VisionConfig
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig

# HF prefix -> the decoder's (LlamaForCausalLM / Qwen2ForCausalLM names) or the tower's.
_TEXT_PREFIXES = (("model.text_model.", "model."), ("model.language_model.", "model."))
_VISION_PREFIXES = ("model.vision_model.", "model.connector.", "visual.", "model.visual.")
# llama.cpp's pre-tokenizer name, which its converter finds by hashing the tokenizer's output on a
# test text: SmolVLM's SmolLM2 vocabulary is "smollm", Qwen2.5-VL's "qwen2".
_TOKENIZER_PRE = {"idefics3": "smollm", "qwen2_5_vl": "qwen2"}
_LANGUAGE_ARCHS = {"idefics3": gguf.MODEL_ARCH.LLAMA, "qwen2_5_vl": gguf.MODEL_ARCH.QWEN2VL}


class GGUFPair(NamedTuple):
    language: Path
    mmproj: Path


def write_gguf_pair(
    folder: Path, out_dir: Path, *, outtype: OutType = "f32", tokenizer_pre: str | None = None
) -> GGUFPair:
    """Write `{name}-{TYPE}.gguf` and `mmproj-{name}-{TYPE}.gguf` into `out_dir` for the folder.
    `tokenizer_pre`: llama.cpp's pre-tokenizer name, if not the family's usual one (a tiny test
    folder with another family's vocabulary)."""
    folder, out_dir = Path(folder), Path(out_dir)
    config = json.loads((folder / "config.json").read_text())
    model_type = {"smolvlm": "idefics3"}.get(config.get("model_type"), config.get("model_type"))
    if model_type not in _LANGUAGE_ARCHS:
        raise ValueError(
            f"{folder}: model_type {config.get('model_type')!r} is not Idefics3 / SmolVLM or Qwen2.5-VL"
        )
    arch = arch_config_from_hf({**config, "model_type": model_type})
    if arch.rope_scaling is not None:
        raise ValueError(f"{folder}: writing RoPE scaling {arch.rope_scaling} is not supported")
    text, vision = _split_tensors(iter_safetensors(folder))
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{folder.name}-{outtype.upper()}"
    pair = GGUFPair(out_dir / f"{name}.gguf", out_dir / f"mmproj-{name}.gguf")
    pre = tokenizer_pre or _TOKENIZER_PRE[model_type]
    _write_language(pair.language, folder, arch, _LANGUAGE_ARCHS[model_type], text, outtype, pre)
    if isinstance(arch.vision, Qwen2_5VisionConfig):
        processor = Qwen2VLProcessorConfig.from_folder(folder)
        write_qwen2_5_vl_mmproj(pair.mmproj, folder.name, config, arch, processor, vision, outtype)
    else:
        assert arch.vision is not None
        idefics3 = Idefics3ProcessorConfig.from_folder(folder)
        write_mmproj(pair.mmproj, folder.name, arch.vision, arch.hidden_size, idefics3, vision, outtype)
    return pair


def _split_tensors(
    tensors: Iterator[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """HF names -> (decoder tensors under the text model's own names, vision tensors; Qwen's tower
    always under `visual.`, the name the converter's map knows)."""
    text, vision = {}, {}
    for name, tensor in tensors:
        if name.startswith(_VISION_PREFIXES):
            vision[name.removeprefix("model.") if name.startswith("model.visual.") else name] = tensor
            continue
        for prefix, ours in _TEXT_PREFIXES:
            if name.startswith(prefix):
                name = ours + name[len(prefix) :]
                break
        text[name] = tensor
    return text, vision


def _write_language(
    path: Path,
    folder: Path,
    arch: ModelArchConfig,
    gguf_arch: gguf.MODEL_ARCH,
    tensors: dict[str, torch.Tensor],
    outtype: OutType,
    tokenizer_pre: str,
) -> None:
    """LlamaModel's / Qwen2VLModel's set_gguf_parameters and tensors."""
    is_llama = gguf_arch == gguf.MODEL_ARCH.LLAMA
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf_arch])
    writer.add_name(folder.name)
    writer.add_file_type(FILE_TYPES[outtype])
    writer.add_context_length(arch.max_position_embeddings)
    writer.add_embedding_length(arch.hidden_size)
    writer.add_block_count(arch.num_hidden_layers)
    writer.add_feed_forward_length(arch.intermediate_size)
    writer.add_head_count(arch.num_attention_heads)
    writer.add_head_count_kv(arch.num_key_value_heads)
    writer.add_layer_norm_rms_eps(arch.rms_norm_eps)
    writer.add_rope_freq_base(arch.rope_theta)
    if is_llama:
        writer.add_rope_dimension_count(arch.head_dim)
        writer.add_vocab_size(arch.vocab_size)
    if arch.mrope_section is not None:  # [t, h, w] padded to llama.cpp's four sections
        writer.add_rope_dimension_sections([*arch.mrope_section, 0, 0, 0][:4])
    _write_vocab(writer, folder, arch.vocab_size, tokenizer_pre)
    name_map = gguf.get_tensor_name_map(gguf_arch, arch.num_hidden_layers)
    for hf_name, tensor in tensors.items():
        if hf_name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # llama.cpp reads a missing output.weight as tied
        values = tensor.float().numpy()
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{folder}: no GGUF name for decoder tensor {hf_name!r}")
        if is_llama and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            heads = arch.num_attention_heads if ".attn_q." in gguf_name else arch.num_key_value_heads
            values = _permute_for_llama_rope(values, heads)
        add_tensor(writer, gguf_name, values, outtype)
    finish(writer)


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
