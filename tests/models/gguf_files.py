"""Synthetic GGUF files written the way llama.cpp's converter writes them (gguf-py's writer and name map)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as Q


def _permute_like_llama_cpp(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _write_rope_scaling(writer: gguf.GGUFWriter, scaling: dict) -> None:
    writer.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
    writer.add_rope_scaling_factor(scaling["factor"])
    if scaling["rope_type"] == "yarn":
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        if "attention_factor" in scaling:
            writer.add_rope_scaling_yarn_attn_factor(scaling["attention_factor"])
        if "beta_fast" in scaling:
            writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        if "beta_slow" in scaling:
            writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])


def write_gguf(
    path: Path, hf_model: torch.nn.Module, arch: str, *, qtype: Q = Q.F32, rope_scaling: dict | None = None
) -> Path:
    """Write `hf_model` as llama.cpp's converter would: its names, permutation and norm offset, and
    `rope_scaling` (linear or yarn, HF keys) as convert_hf_to_gguf's `set_gguf_parameters` writes it."""
    config = hf_model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_uint32(f"{arch}.context_length", config.max_position_embeddings)
    writer.add_uint32(f"{arch}.embedding_length", config.hidden_size)
    writer.add_uint32(f"{arch}.block_count", config.num_hidden_layers)
    writer.add_uint32(f"{arch}.feed_forward_length", config.intermediate_size)
    writer.add_uint32(f"{arch}.attention.head_count", config.num_attention_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32(f"{arch}.rope.freq_base", 10_000.0)
    if rope_scaling is not None:
        _write_rope_scaling(writer, rope_scaling)
    if arch == "gemma3":
        writer.add_uint32(f"{arch}.attention.sliding_window", config.sliding_window)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    for hf_name, tensor in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{name_map.get_name(stem)}.{suffix}"
        values = tensor.numpy().astype(np.float32)
        if arch == "llama" and ".attn_q." in gguf_name:
            values = _permute_like_llama_cpp(values, config.num_attention_heads)
        if arch == "llama" and ".attn_k." in gguf_name:
            values = _permute_like_llama_cpp(values, config.num_key_value_heads)
        if arch == "gemma3" and gguf_name.endswith("norm.weight"):
            values = values + 1.0
        if values.ndim == 2 and qtype != Q.F32:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
