"""GGUF metadata → HF `config.json`-style dict, for the llama / qwen2 / qwen3 / gemma3 arches (and
`qwen2vl`, Qwen2.5-VL's decoder, whose text alone is a Qwen2: M-RoPE with t = h = w is RoPE).

Key names follow transformers' `GGUF_CONFIG_MAPPING` (integrations/ggml.py); what GGUF does
not store (Gemma 3's layer pattern, local RoPE base, attention scale) follows llama.cpp's
`llama-model.cpp`, which is what the file was made for.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvserve.models.errors import CorruptModelFileError, UnsupportedModelError
from kvserve.models.loader.gguf_reader import GGUFFile

# GGUF architecture -> (HF model_type, HF architectures entry)
HF_MODEL_TYPES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen2vl": ("qwen2", "Qwen2ForCausalLM"),  # with its mmproj: Qwen2.5-VL (loader/mmproj_qwen2_5_vl.py)
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}
_GEMMA3_SLIDING_PATTERN = 6  # llama.cpp `set_swa_pattern(6)`: every 6th layer is global
_GEMMA3_LOCAL_ROPE_BASE = 10_000.0
_GEMMA3_27B_LAYERS = 62  # the one size whose attention scale is hidden/heads, not head_dim
# Llama 3.x rope scaling constants; only `factor` differs between releases (8 for 3.1, 32 for 3.2).
_LLAMA3_LOW_FREQ_FACTOR, _LLAMA3_HIGH_FREQ_FACTOR, _LLAMA3_ORIGINAL_CONTEXT = 1.0, 4.0, 8192


def hf_config_from_gguf(gguf: GGUFFile) -> dict[str, Any]:
    """The config.json an HF checkpoint of the same model would have."""
    arch = gguf.architecture
    if arch not in HF_MODEL_TYPES:
        raise UnsupportedModelError(
            gguf.path, f"architecture {arch!r} is not supported (have: {sorted(HF_MODEL_TYPES)})"
        )
    meta = gguf.metadata

    def key(name: str, default: Any = ...) -> Any:
        full = f"{arch}.{name}"
        if full not in meta:
            if default is ...:
                raise CorruptModelFileError(gguf.path, f"metadata key {full!r} is missing")
            return default
        return meta[full]

    model_type, hf_class = HF_MODEL_TYPES[arch]
    hidden_size, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", 0) or (arch == "llama" and key("rope.dimension_count", 0)))
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [hf_class],
        "vocab_size": _vocab_size(gguf),
        "hidden_size": hidden_size,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _uniform(
            gguf, "attention.head_count_kv", key("attention.head_count_kv", num_heads)
        ),
        "head_dim": head_dim or hidden_size // num_heads,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10_000.0)),
        "rope_scaling": _rope_scaling(gguf, key),
        "max_position_embeddings": int(key("context_length")),
        "tie_word_embeddings": "output.weight" not in gguf.tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensor_names,
        "hidden_act": "silu",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    if arch == "gemma3":
        config |= _gemma3_extras(config, key("attention.sliding_window"))
    return config


def _gemma3_extras(config: dict[str, Any], sliding_window: int) -> dict[str, Any]:
    num_layers = config["num_hidden_layers"]
    if num_layers == _GEMMA3_27B_LAYERS:
        query_pre_attn_scalar = config["hidden_size"] // config["num_attention_heads"]
    else:
        query_pre_attn_scalar = config["head_dim"]
    layer_types = [
        "full_attention" if (i + 1) % _GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": int(sliding_window),
        "layer_types": layer_types,
        "rope_local_base_freq": _GEMMA3_LOCAL_ROPE_BASE,
        "query_pre_attn_scalar": query_pre_attn_scalar,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


def _vocab_size(gguf: GGUFFile) -> int:
    for info in gguf.tensors:
        if info.name == "token_embd.weight":
            return info.shape[0]
    raise CorruptModelFileError(gguf.path, "tensor 'token_embd.weight' is missing")


def _uniform(gguf: GGUFFile, name: str, value: int | list[int]) -> int:
    """Some files store per-layer lists; kvserve needs one value for all layers."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedModelError(gguf.path, f"per-layer {name} {sorted(set(value))} is not supported")
        return int(value[0])
    return int(value)


# llama.cpp's optional YaRN keys (gguf-py constants.py, Keys.Rope) -> transformers' rope_scaling keys.
_YARN_KEYS = {
    "rope.scaling.yarn_beta_fast": "beta_fast",
    "rope.scaling.yarn_beta_slow": "beta_slow",
    "rope.scaling.yarn_attn_factor": "attention_factor",  # convert_hf_to_gguf writes HF's here
}


def _rope_scaling(gguf: GGUFFile, key: Any) -> dict[str, Any] | None:
    """HF's rope_scaling from `{arch}.rope.scaling.*` (and the older `rope.scale_linear`)."""
    scaling_type = key("rope.scaling.type", "none")
    if "rope_freqs.weight" in gguf.tensor_names:
        return _llama3_rope_scaling(gguf, key)
    if scaling_type == "none":
        scale_linear = float(key("rope.scale_linear", 1.0))
        return None if scale_linear == 1.0 else {"rope_type": "linear", "factor": scale_linear}
    factor = float(key("rope.scaling.factor"))
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": factor}
    if scaling_type == "yarn":
        original = int(key("rope.scaling.original_context_length"))
        scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
        for gguf_key, hf_key in _YARN_KEYS.items():
            value = key(gguf_key, None)
            if value is not None:
                scaling[hf_key] = float(value)
        if float(key("rope.scaling.yarn_ext_factor", 1.0)) != 1.0 or key(
            "rope.scaling.yarn_log_multiplier", 0.0
        ):
            # DeepSeek-style extrapolation mixes and log multipliers have no transformers counterpart here.
            raise UnsupportedModelError(gguf.path, "YaRN ext_factor / log_multiplier other than the defaults")
        return scaling
    raise UnsupportedModelError(gguf.path, f"rope scaling type {scaling_type!r} is not supported")


def _llama3_rope_scaling(gguf: GGUFFile, key: Any) -> dict[str, Any]:
    """Recover HF's llama3 rope_scaling from the per-frequency factors llama.cpp stores instead."""
    info = next(t for t in gguf.tensors if t.name == "rope_freqs.weight")
    stored = gguf.raw(info).view(np.float32).reshape(-1)
    head_dim = int(key("rope.dimension_count", 0) or key("embedding_length") // key("attention.head_count"))
    factor = float(stored.max())
    expected = _llama3_freq_factors(float(key("rope.freq_base", 10_000.0)), head_dim, factor)
    if stored.shape != expected.shape or not np.allclose(stored, expected, rtol=1e-3):
        raise UnsupportedModelError(gguf.path, "rope_freqs.weight does not match Llama 3 rope scaling")
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": _LLAMA3_LOW_FREQ_FACTOR,
        "high_freq_factor": _LLAMA3_HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": _LLAMA3_ORIGINAL_CONTEXT,
    }


def _llama3_freq_factors(rope_theta: float, head_dim: int, factor: float) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `rope_freqs` for Llama 3 (the inverse of a frequency's scale)."""
    low_wavelen = _LLAMA3_ORIGINAL_CONTEXT / _LLAMA3_LOW_FREQ_FACTOR
    high_wavelen = _LLAMA3_ORIGINAL_CONTEXT / _LLAMA3_HIGH_FREQ_FACTOR
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * rope_theta ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (_LLAMA3_ORIGINAL_CONTEXT / wavelen - _LLAMA3_LOW_FREQ_FACTOR) / (
                _LLAMA3_HIGH_FREQ_FACTOR - _LLAMA3_LOW_FREQ_FACTOR
            )
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)
