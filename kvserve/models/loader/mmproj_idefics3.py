"""The `idefics3` mmproj (SmolVLM): a SigLIP tower and the pixel-shuffle connector, mapped onto
Idefics3's HF names; its `clip.vision.*` keys give SmolVLM's image processor (tile = `image_size`,
longest edge = `preproc_image_size`, mean/std)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from kvserve.models.errors import CorruptModelFileError
from kvserve.models.loader.gguf_reader import GGUFFile
from kvserve.models.loader.mmproj_format import MmprojKeys, ProjectorHeader, decimal, load_tensor, triple
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig

_NUM_CHANNELS = 3  # clip.cpp's encoders read RGB; the file does not say
# SmolVLM's processors resize the longest edge to 4 tiles (2048 for 512-pixel tiles, 1536 for 384).
_DEFAULT_TILES_PER_LONGEST_EDGE = 4

_GLOBAL_NAMES = {
    "v.patch_embd": "model.vision_model.embeddings.patch_embedding",
    "v.position_embd": "model.vision_model.embeddings.position_embedding",
    "v.post_ln": "model.vision_model.post_layernorm",
    "mm.model.fc": "model.connector.modality_projection.proj",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


class Idefics3Format:
    """`idefics3` as a `ProjectorFormat` (mmproj_format.py)."""

    projector_type = "idefics3"
    language_architecture = "llama"
    token_keys = (("image_token_id", "<image>"),)  # the placeholder the projector's rows replace

    def read_header(self, keys: MmprojKeys, text_hidden_size: int) -> ProjectorHeader:
        vision = {
            "hidden_size": int(keys.vision("embedding_length")),
            "intermediate_size": int(keys.vision("feed_forward_length")),
            "num_hidden_layers": int(keys.vision("block_count")),
            "num_attention_heads": int(keys.vision("attention.head_count")),
            "image_size": int(keys.vision("image_size")),
            "patch_size": int(keys.vision("patch_size")),
            "num_channels": _NUM_CHANNELS,
            "layer_norm_eps": decimal(keys.vision("attention.layer_norm_epsilon")),
            "hidden_act": "gelu_pytorch_tanh",  # clip.use_gelu: ggml's gelu is the tanh form
        }
        scale_factor = int(keys.get("clip.vision.projector.scale_factor", 2))
        patch, tile = vision["patch_size"], vision["image_size"]
        if patch < 1 or scale_factor < 1 or tile % (patch * scale_factor):
            raise CorruptModelFileError(
                keys.path,
                f"{tile}-px tiles are no whole grid of {patch}-px patches merged {scale_factor} x {scale_factor}",
            )
        processor = _processor(keys, vision, scale_factor)
        return ProjectorHeader(
            vision_config=vision,
            top_level={"scale_factor": scale_factor},
            processor=processor,
            tensor_shapes=expected_shapes(vision, scale_factor, text_hidden_size),
            summary=f"idefics3, {tile}-px tiles of {processor.image_seq_len} tokens, "
            f"images up to {processor.longest_edge} px",
        )

    def hf_config(
        self,
        language: GGUFFile,
        text_config: dict[str, Any],
        header: ProjectorHeader,
        token_ids: dict[str, int],
    ) -> dict[str, Any]:
        return {
            "model_type": "idefics3",
            "architectures": ["Idefics3ForConditionalGeneration"],
            "text_config": text_config,
            "vision_config": header.vision_config,
            **header.top_level,
            **token_ids,
            "tie_word_embeddings": text_config["tie_word_embeddings"],
        }

    def hf_tensors(self, mmproj: GGUFFile) -> Iterator[tuple[str, torch.Tensor]]:
        for info in mmproj.tensors:
            yield hf_vision_name(info.name), load_tensor(mmproj, info)


IDEFICS3 = Idefics3Format()


def _processor(keys: MmprojKeys, vision: dict[str, Any], scale_factor: int) -> Idefics3ProcessorConfig:
    """SmolVLM's processor (Lanczos resize, tiles, the global image, 1/255 then mean/std) with the
    sizes the file gives; what it lacks is SmolVLM's default."""
    tile = vision["image_size"]
    default = Idefics3ProcessorConfig()
    return Idefics3ProcessorConfig(
        longest_edge=int(keys.get("clip.vision.preproc_image_size", _DEFAULT_TILES_PER_LONGEST_EDGE * tile)),
        tile_size=tile,
        image_mean=triple(keys.get("clip.vision.image_mean", default.image_mean)),
        image_std=triple(keys.get("clip.vision.image_std", default.image_std)),
        image_seq_len=(tile // vision["patch_size"]) ** 2 // scale_factor**2,
    )


def hf_vision_name(gguf_name: str) -> str:
    """HF parameter name of an mmproj tensor (KeyError for one Idefics3 has no place for)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        raise KeyError(gguf_name)
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) != 4 or parts[:2] != ["v", "blk"] or not parts[2].isdigit():
        raise KeyError(gguf_name)
    return f"model.vision_model.encoder.layers.{parts[2]}.{_LAYER_NAMES[parts[3]]}.{suffix}"


def expected_shapes(vision: dict[str, Any], scale_factor: int, text_hidden_size: int) -> dict[str, tuple]:
    """Every tensor an idefics3 mmproj holds, in torch order; the patch embedding is the conv
    kernel [hidden, channels, patch, patch] (ggml's [patch, patch, channels, hidden] reversed)."""
    hidden, ffn, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    num_positions = (vision["image_size"] // patch) ** 2
    shapes: dict[str, tuple] = {
        "v.patch_embd.weight": (hidden, _NUM_CHANNELS, patch, patch),
        "v.patch_embd.bias": (hidden,),
        "v.position_embd.weight": (num_positions, hidden),
        "v.post_ln.weight": (hidden,),
        "v.post_ln.bias": (hidden,),
        "mm.model.fc.weight": (text_hidden_size, hidden * scale_factor**2),
    }
    per_layer = {"attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden)}
    per_layer |= {"attn_out": (hidden, hidden), "ln1": (hidden,), "ln2": (hidden,)}
    per_layer |= {"ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for layer in range(vision["num_hidden_layers"]):
        for name, shape in per_layer.items():
            shapes[f"v.blk.{layer}.{name}.weight"] = shape
            shapes[f"v.blk.{layer}.{name}.bias"] = shape[:1]
    return shapes
