"""The `qwen2.5vl_merger` mmproj (Qwen2.5-VL) beside a `qwen2vl` language GGUF, mapped onto
Qwen2.5-VL's HF names, as llama.cpp's `convert_hf_to_gguf.py` (`Qwen2VLVisionModel`) writes it and
its `tools/mtmd/clip.cpp` reads it:

- the tower's Conv3d patch embedding is split into one Conv2d per frame (`v.patch_embd.weight`,
  `v.patch_embd.weight.1`), stacked back here; its fused `qkv` is split into `attn_q/k/v`, fused
  back here; the merger is `v.post_ln` (its RMSNorm) and `mm.0` / `mm.2` (its MLP);
- window attention is `clip.vision.n_wa_pattern`: block i attends over the whole image when
  (i + 1) % n == 0 (HF's `fullatt_block_indexes`); `clip.use_silu` says the MLP is SiLU;
- the decoder's M-RoPE sections are the language file's `qwen2vl.rope.dimension_sections`.

clip.cpp fixes what the converter does not write for this projector: windows of 112 pixels, 2 x 2
merging, and images of 8 to 4096 tokens. A file that carries `clip.vision.window_size`,
`spatial_merge_size`, `image_min_pixels` or `image_max_pixels` (keys clip.cpp reads for other
projectors; our exporter writes them so that folders of other sizes come back as they were) is
read by them; without them, llama.cpp's fixed values hold, so an image gets the tokens llama-server
gives it on the same file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from kvserve.models.errors import CorruptModelFileError, UnsupportedModelError
from kvserve.models.loader.gguf_reader import GGUFFile
from kvserve.models.loader.mmproj_format import MmprojKeys, ProjectorHeader, decimal, load_tensor, triple
from kvserve.models.vision.qwen2_vl_processor import CLIP_MEAN, CLIP_STD, Qwen2VLProcessorConfig

NUM_CHANNELS, TEMPORAL_PATCH_SIZE = 3, 2  # the converter splits exactly two frames
LLAMA_CPP_WINDOW, LLAMA_CPP_MERGE = 112, 2
LLAMA_CPP_IMAGE_TOKENS = (8, 4096)  # clip.cpp's set_limit_image_tokens(8, 4096) for Qwen2/2.5-VL
TOWER_RMS_EPS = 1e-6  # HF's tower norms are fixed at 1e-6 (the converter writes the decoder's eps)
VISION_ROPE_THETA = 10_000.0  # clip.cpp's, and HF's default

_GLOBAL_NAMES = {
    "v.post_ln.weight": "visual.merger.ln_q.weight",
    "mm.0.weight": "visual.merger.mlp.0.weight",
    "mm.0.bias": "visual.merger.mlp.0.bias",
    "mm.2.weight": "visual.merger.mlp.2.weight",
    "mm.2.bias": "visual.merger.mlp.2.bias",
}
_LAYER_NAMES = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_PATCH_EMBEDS = ("v.patch_embd.weight", "v.patch_embd.weight.1")  # frame 0, frame 1


class Qwen2_5VLFormat:
    """`qwen2.5vl_merger` as a `ProjectorFormat` (mmproj_format.py)."""

    projector_type = "qwen2.5vl_merger"
    language_architecture = "qwen2vl"
    token_keys = (
        ("image_token_id", "<|image_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    )

    def read_header(self, keys: MmprojKeys, text_hidden_size: int) -> ProjectorHeader:
        if not keys.get("clip.use_silu", False) or keys.get("clip.use_gelu", False):
            raise UnsupportedModelError(
                keys.path, "a qwen2.5vl_merger tower's MLP must be SiLU (clip.use_silu)"
            )
        eps = decimal(keys.vision("attention.layer_norm_epsilon"))
        if eps != TOWER_RMS_EPS:
            raise UnsupportedModelError(
                keys.path, f"tower norm epsilon {eps} (Qwen2.5-VL's is {TOWER_RMS_EPS})"
            )
        vision = _vision_config(keys, text_hidden_size)
        processor = _processor(keys, vision)
        tokens = (processor.min_pixels // processor.factor**2, processor.max_pixels // processor.factor**2)
        return ProjectorHeader(
            vision_config=vision,
            top_level={},
            processor=processor,
            tensor_shapes=expected_shapes(vision),
            summary=f"qwen2.5-vl, {vision['patch_size']}-px patches merged {vision['spatial_merge_size']} x "
            f"{vision['spatial_merge_size']}, images of {tokens[0]} to {tokens[1]} tokens",
        )

    def hf_config(
        self,
        language: GGUFFile,
        text_config: dict[str, Any],
        header: ProjectorHeader,
        token_ids: dict[str, int],
    ) -> dict[str, Any]:
        rope = {
            **(text_config.get("rope_scaling") or {"rope_type": "default"}),
            "rope_theta": text_config["rope_theta"],
            "mrope_section": list(mrope_sections(language)),
        }
        dropped = ("rope_scaling", "model_type", "architectures")
        text = {k: v for k, v in text_config.items() if k not in dropped} | {"rope_parameters": rope}
        return {
            "model_type": "qwen2_5_vl",
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "text_config": text,
            "vision_config": header.vision_config,
            **token_ids,
            "tie_word_embeddings": text_config["tie_word_embeddings"],
        }

    def hf_tensors(self, mmproj: GGUFFile) -> Iterator[tuple[str, torch.Tensor]]:
        infos = {info.name: info for info in mmproj.tensors}

        def tensor(name: str) -> torch.Tensor:
            return load_tensor(mmproj, infos[name])

        # [hidden, channels, frames, patch, patch]: the Conv3d the two Conv2d kernels came from.
        yield "visual.patch_embed.proj.weight", torch.stack([tensor(n) for n in _PATCH_EMBEDS], dim=2)
        for name in infos:
            if name in _PATCH_EMBEDS:
                continue
            if name in _GLOBAL_NAMES:
                yield _GLOBAL_NAMES[name], tensor(name)
                continue
            _, _, layer, kind, suffix = name.split(".")  # v.blk.{i}.{kind}.{suffix}, names checked
            if kind == "attn_q":  # k and v go with it, in HF's fused [q; k; v] order
                qkv = torch.cat([tensor(f"v.blk.{layer}.attn_{x}.{suffix}") for x in "qkv"])
                yield f"visual.blocks.{layer}.attn.qkv.{suffix}", qkv
            elif kind not in ("attn_k", "attn_v"):
                yield f"visual.blocks.{layer}.{_LAYER_NAMES[kind]}.{suffix}", tensor(name)


QWEN2_5_VL = Qwen2_5VLFormat()


def mrope_sections(language: GGUFFile) -> tuple[int, int, int]:
    """The decoder's M-RoPE (t, h, w) sections, in rotary pairs as HF's `mrope_section`: llama.cpp
    pads them with a fourth, 0 for Qwen2/2.5-VL."""
    key = f"{language.architecture}.rope.dimension_sections"
    if key not in language.metadata:
        raise CorruptModelFileError(language.path, f"metadata key {key!r} (M-RoPE sections) is missing")
    try:
        sections = [int(s) for s in language.metadata[key]]
    except (TypeError, ValueError):
        raise CorruptModelFileError(language.path, f"metadata key {key!r} is no list of counts") from None
    if len(sections) < 3 or any(sections[3:]) or min(sections[:3]) < 0:
        raise UnsupportedModelError(language.path, f"M-RoPE sections {sections} are not (t, h, w[, 0])")
    t, h, w = sections[:3]
    return t, h, w


def _vision_config(keys: MmprojKeys, text_hidden_size: int) -> dict[str, Any]:
    """HF's `vision_config` for the tower the header describes."""
    depth, patch = int(keys.vision("block_count")), int(keys.vision("patch_size"))
    hidden, num_heads = int(keys.vision("embedding_length")), int(keys.vision("attention.head_count"))
    merge = int(keys.get("clip.vision.spatial_merge_size", LLAMA_CPP_MERGE))
    window = int(keys.get("clip.vision.window_size", LLAMA_CPP_WINDOW))
    pattern = int(keys.vision("n_wa_pattern"))
    if (
        min(depth, patch, merge, num_heads) < 1
        or hidden % num_heads
        or window % (patch * merge)
        or window < 1
    ):
        raise CorruptModelFileError(
            keys.path,
            f"a tower of {depth} blocks, {hidden} wide in {num_heads} heads, {patch}-px patches merged "
            f"{merge} x {merge} in {window}-px windows is not one Qwen2.5-VL can be",
        )
    # clip.cpp: no pattern (0) is full attention everywhere.
    fullatt = [i for i in range(depth) if pattern == 0 or (i + 1) % pattern == 0]
    return {
        "depth": depth,
        "hidden_size": hidden,
        "intermediate_size": int(keys.vision("feed_forward_length")),
        "num_heads": num_heads,
        "out_hidden_size": text_hidden_size,
        "in_channels": NUM_CHANNELS,
        "patch_size": patch,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "spatial_merge_size": merge,
        "window_size": window,
        "fullatt_block_indexes": fullatt,
        "hidden_act": "silu",
        "rope_parameters": {"rope_theta": VISION_ROPE_THETA},
    }


def _processor(keys: MmprojKeys, vision: dict[str, Any]) -> Qwen2VLProcessorConfig:
    """Qwen2-VL's processor (bicubic `smart_resize`, 1/255 then mean/std, patches) with the file's
    patch, merge, mean/std and pixel bounds; llama.cpp's bounds where it has none."""
    factor = vision["patch_size"] * vision["spatial_merge_size"]
    min_tokens, max_tokens = LLAMA_CPP_IMAGE_TOKENS
    min_pixels = int(keys.get("clip.vision.image_min_pixels", min_tokens * factor**2))
    max_pixels = int(keys.get("clip.vision.image_max_pixels", max_tokens * factor**2))
    if not 0 < min_pixels <= max_pixels:
        raise CorruptModelFileError(keys.path, f"image pixel bounds [{min_pixels}, {max_pixels}] are empty")
    return Qwen2VLProcessorConfig(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=vision["patch_size"],
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        merge_size=vision["spatial_merge_size"],
        image_mean=triple(keys.get("clip.vision.image_mean", CLIP_MEAN)),
        image_std=triple(keys.get("clip.vision.image_std", CLIP_STD)),
    )


def expected_shapes(vision: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor a qwen2.5vl_merger mmproj holds, in torch order (GGUF's reversed)."""
    hidden, ffn, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    merged, out = hidden * vision["spatial_merge_size"] ** 2, vision["out_hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        name: (hidden, NUM_CHANNELS, patch, patch) for name in _PATCH_EMBEDS
    }
    shapes |= {"v.post_ln.weight": (hidden,), "mm.0.weight": (merged, merged), "mm.0.bias": (merged,)}
    shapes |= {"mm.2.weight": (out, merged), "mm.2.bias": (out,)}
    linear = {"attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden)}
    linear |= {"attn_out": (hidden, hidden), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden)}
    linear |= {"ffn_down": (hidden, ffn)}
    for layer in range(vision["depth"]):
        for name, shape in linear.items():
            shapes[f"v.blk.{layer}.{name}.weight"] = shape
            shapes[f"v.blk.{layer}.{name}.bias"] = shape[:1]
        for norm in ("ln1", "ln2"):  # RMSNorm: no bias
            shapes[f"v.blk.{layer}.{norm}.weight"] = (hidden,)
    return shapes
