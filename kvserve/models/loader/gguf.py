"""GGUF → Hugging Face: dequantized tensors under HF names, and an HF-style config dict.

Mirrors transformers' GGUF integration (`modeling_gguf_pytorch_utils.py`, `integrations/ggml.py`),
the parity oracle: llama.cpp's conversion changes are undone here (the Q/K row permutation of
the `llama` arch, Gemma's norms stored as 1 + w), so the family modules see HF checkpoints only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType as Q
from tqdm import tqdm

from kvserve.models.errors import CorruptModelFileError, UnsupportedModelError
from kvserve.models.loader.gguf_config import hf_config_from_gguf
from kvserve.models.loader.gguf_reader import GGUFFile, GGUFTensorInfo, read_gguf

__all__ = [
    "SUPPORTED_TYPES",
    "dequantize",
    "file_weight_quant",
    "hf_config_from_gguf",
    "hf_tensor_name",
    "iter_hf_tensors",
    "read_gguf",
]

SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)

# The low-bit decode copy (models/layers/quant.py: groups of 32, fp16 scales) that holds each type's
# values: int4 (a scale and a minimum per group, Q4_1's own form) for 2 to 4 bits, int8 (Q8_0's
# form) for 5 to 8.
_HELD_BY_INT4 = frozenset({Q.Q2_K, Q.Q3_K, Q.Q4_0, Q.Q4_1, Q.Q4_K})
_HELD_BY_INT8 = frozenset({Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0})

# gguf-py's per-type block codecs. Its `dequantize` calls them 16 rows at a time; 256-row chunks
# halve the load time of a small model (numpy call overhead) with the same per-block arithmetic.
_QUANTS = {t: getattr(gguf_quants, t.name) for t in SUPPORTED_TYPES - {Q.F32, Q.F16, Q.BF16}}
_ROWS_PER_CHUNK = 256

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per layer; llama.cpp's ffn_norm is its pre-feedforward norm.
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Consumed by the config translation (llama3 rope scaling), not a module weight.
_CONFIG_ONLY_TENSORS = frozenset({"rope_freqs.weight"})


def dequantize(raw: np.ndarray, ggml_type: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """Stored bytes ([rows, bytes_per_row] uint8) → float32 tensor of `shape`."""
    if ggml_type not in SUPPORTED_TYPES:
        raise ValueError(f"unsupported ggml type {ggml_type.name}")
    if ggml_type == Q.F32:
        return torch.from_numpy(raw.view(np.float32).copy()).reshape(shape)
    if ggml_type == Q.F16:
        return torch.from_numpy(raw.view(np.float16).astype(np.float32)).reshape(shape)
    if ggml_type == Q.BF16:
        return torch.from_numpy(raw.copy()).view(torch.bfloat16).float().reshape(shape)
    quant = _QUANTS[ggml_type]
    quant.init_grid()
    rows = raw.reshape(-1, raw.shape[-1])
    chunks = [
        quant.dequantize_rows(rows[i : i + _ROWS_PER_CHUNK]) for i in range(0, len(rows), _ROWS_PER_CHUNK)
    ]
    return torch.from_numpy(np.concatenate(chunks)).reshape(shape)


def file_weight_quant(gguf: GGUFFile) -> str | None:
    """ "int4" or "int8": the low-bit copy that holds every layer matrix of the file at its own
    precision (a mixed Q4_K_M file with Q6_K tensors needs int8); None for 16/32-bit layers."""
    types = {info.ggml_type for info in gguf.tensors if info.name.startswith("blk.") and len(info.shape) == 2}
    if not types:
        return None
    if types <= _HELD_BY_INT4:
        return "int4"
    if types <= _HELD_BY_INT4 | _HELD_BY_INT8:
        return "int8"
    return None


def hf_tensor_name(gguf_name: str, architecture: str) -> str | None:
    """HF parameter name for a GGUF tensor; None for a tensor with no module weight."""
    if gguf_name in _CONFIG_ONLY_TENSORS:
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[3] not in ("weight", "bias"):
        raise KeyError(gguf_name)
    layer_names = _GEMMA3_LAYER_NAMES if architecture == "gemma3" else _LAYER_NAMES
    return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"


def iter_hf_tensors(
    gguf: GGUFFile, config: dict[str, Any], dtype: torch.dtype, *, progress: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, tensor in `dtype`) for every module weight, dequantizing one tensor at a time.

    Names and types are checked for the whole file before the first tensor is read.
    """
    plan = _load_plan(gguf)
    bar = tqdm(plan, desc=f"Loading {gguf.path.name}", unit="tensor", file=sys.stderr, disable=not progress)
    for info, hf_name in bar:
        weights = dequantize(gguf.raw(info), info.ggml_type, info.shape)
        # Undo llama.cpp's changes in float32, before rounding to the compute dtype.
        yield hf_name, _undo_conversion(weights, info.name, gguf.architecture, config).to(dtype)


def _load_plan(gguf: GGUFFile) -> list[tuple[GGUFTensorInfo, str]]:
    plan = []
    for info in gguf.tensors:
        try:
            hf_name = hf_tensor_name(info.name, gguf.architecture)
        except KeyError:
            raise UnsupportedModelError(
                gguf.path, f"unknown tensor {info.name!r} for {gguf.architecture}"
            ) from None
        if hf_name is None:
            continue
        if info.ggml_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                gguf.path, f"tensor {info.name!r} has unsupported type {info.ggml_type.name}"
            )
        plan.append((info, hf_name))
    if not plan:
        raise CorruptModelFileError(gguf.path, "no tensors")
    return plan


def _undo_conversion(
    weights: torch.Tensor, gguf_name: str, architecture: str, config: dict[str, Any]
) -> torch.Tensor:
    if architecture == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        is_query = ".attn_q." in gguf_name
        return _unpermute_rope_rows(
            weights, config["num_attention_heads" if is_query else "num_key_value_heads"]
        )
    if architecture == "gemma3" and gguf_name.endswith("norm.weight"):
        return weights - 1.0  # llama.cpp folds Gemma's (1 + w) RMSNorm scale into the stored weight
    return weights


def _unpermute_rope_rows(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: its rope pairs adjacent rows; HF pairs the two head halves."""
    # [num_heads * head_dim, ...] -> [num_heads, head_dim / 2, 2, ...] -> [num_heads, 2, head_dim / 2, ...]
    head_half = weights.shape[0] // num_heads // 2
    per_head = weights.reshape(num_heads, head_half, 2, *weights.shape[1:])
    return per_head.transpose(1, 2).reshape(weights.shape)


def read_gguf_config(path: str | Path) -> tuple[GGUFFile, dict[str, Any]]:
    """Parse the header and translate its metadata (no tensor data read beyond small config tensors)."""
    gguf = read_gguf(path)
    return gguf, hf_config_from_gguf(gguf)
