"""Architecture description shared by every model family (HF config.json semantics)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from kvserve.models.vision.config import (
    Qwen2_5VisionConfig,
    VisionArchConfig,
    idefics3_vision_from_hf,
    qwen2_5_vl_vision_from_hf,
)

LayerType = Literal["full_attention", "sliding_attention"]


@dataclass(frozen=True)
class ModelArchConfig:
    """What a family module needs to build itself; field names follow HF `config.json`.

    Built by `arch_config_from_hf` (safetensors folders) or by the GGUF loader, which
    translates GGUF metadata into the same HF-style dict first.
    """

    architecture: str  # "llama" | "qwen2" | "qwen3" | "gemma3" | "idefics3" | "qwen2_5_vl" (HF model_type)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2: bias on q/k/v
    hidden_act: str = "silu"
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # frozen dict items (linear / llama3 / yarn)
    # Gemma 3: sliding-window layers use their own RoPE base and a window.
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()
    rope_local_base_freq: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    vision: VisionArchConfig | Qwen2_5VisionConfig | None = None  # image-text models: encoder and connector
    # M-RoPE (Qwen2.5-VL): how many rotary frequencies follow the t, h and w positions (sums to
    # head_dim / 2); None: one position per token.
    mrope_section: tuple[int, ...] | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=())
    # The context plan added `rope_scaling` (automatic YaRN past the trained context) and keeps the
    # model's own RoPE for requests that fit that context: the model builds both tables (common.py).
    # Not in the fingerprint: the block hashes tell the regimes apart (engine/rope_regime.py).
    rope_scaling_on_demand: bool = False

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling is not None else None

    @property
    def trained_arch(self) -> ModelArchConfig:
        """The architecture as trained, without the on-demand RoPE scaling the context plan added."""
        assert self.rope_scaling_on_demand
        return replace(self, rope_scaling=None, rope_scaling_on_demand=False)

    @property
    def context_length(self) -> int:
        """The context the model is made for: `max_position_embeddings`, or for YaRN the original
        context times the factor when that is larger (Qwen ships YaRN configs with
        max_position_embeddings = the original context, as vLLM's derived max length does)."""
        scaling = self.rope_scaling_dict or {}
        if scaling.get("rope_type") == "yarn":
            extended = int(scaling["original_max_position_embeddings"] * scaling["factor"])
            return max(self.max_position_embeddings, extended)
        return self.max_position_embeddings

    def layer_type(self, layer_idx: int) -> LayerType:
        return self.layer_types[layer_idx] if self.layer_types else "full_attention"


# HF model_type -> the family module that runs it (see registry.py).
_MODEL_TYPE_ALIASES = {"gemma3_text": "gemma3", "mistral": "llama"}
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # Values HF's config classes assume when config.json omits them.
    "llama": {"tie_word_embeddings": False, "rope_theta": 10_000.0, "max_position_embeddings": 2048},
    "qwen2": {"tie_word_embeddings": False, "rope_theta": 10_000.0, "max_position_embeddings": 32768},
    "qwen3": {"tie_word_embeddings": False, "rope_theta": 10_000.0, "max_position_embeddings": 32768},
    "qwen2_5_vl": {
        "tie_word_embeddings": False,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 128_000,
    },
    # Idefics3's text_config is a Llama whose rms_norm_eps HF defaults to 1e-5.
    "idefics3": {
        "tie_word_embeddings": False,
        "rope_theta": 10_000.0,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
    },
    "gemma3": {
        "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 131_072,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "rms_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    },
}


def arch_config_from_hf(hf: dict[str, Any]) -> ModelArchConfig:
    """An HF `config.json` dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x
    `rope_parameters`; multimodal Gemma 3 and Idefics3 via their `text_config`) -> ModelArchConfig.

    Unknown model types pass through unchanged; the registry rejects what it cannot run.
    """
    if "text_config" in hf and hf.get("model_type") == "gemma3":
        hf = {
            **hf["text_config"],
            "model_type": "gemma3",
            "tie_word_embeddings": hf.get("tie_word_embeddings", True),
        }
    vision = None
    if hf.get("model_type") == "idefics3":  # the decoder is text_config's; the top level adds vision
        vision = idefics3_vision_from_hf(hf)
        text = {k: v for k, v in (hf.get("text_config") or {}).items() if k != "tie_word_embeddings"}
        hf = {**text, "model_type": "idefics3", "tie_word_embeddings": hf.get("tie_word_embeddings", False)}
    if hf.get("model_type") == "qwen2_5_vl":
        # transformers 5 nests the decoder in text_config; the released checkpoints keep it at the top.
        vision = qwen2_5_vl_vision_from_hf(hf)
        text = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
        hf = {**text, **(hf.get("text_config") or {}), "model_type": "qwen2_5_vl"}
        hf["tie_word_embeddings"] = text.get("tie_word_embeddings", hf.get("tie_word_embeddings", False))
    mrope_section = _mrope_section(hf)
    model_type = str(hf.get("model_type", ""))
    family = _MODEL_TYPE_ALIASES.get(model_type, model_type)
    defaults = _FAMILY_DEFAULTS.get(family, _FAMILY_DEFAULTS["llama"])
    cfg = {**defaults, **{k: v for k, v in hf.items() if v is not None}}
    num_heads = int(cfg["num_attention_heads"])
    num_layers = int(cfg["num_hidden_layers"])
    rope_theta, rope_scaling, local_theta = _rope_fields(cfg)
    layer_types, sliding_window = _layer_types(family, cfg, num_layers)
    return ModelArchConfig(
        architecture=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads", num_heads)),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        attention_bias=family in ("qwen2", "qwen2_5_vl") or bool(cfg.get("attention_bias", False)),
        hidden_act=str(cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")),
        rope_scaling=tuple(sorted(rope_scaling.items())) if rope_scaling else None,
        sliding_window=sliding_window,
        layer_types=layer_types,
        rope_local_base_freq=local_theta if family == "gemma3" else None,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if family == "gemma3" else None,
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        vision=vision,
        mrope_section=mrope_section,
        extra=(("hf_model_type", model_type),),
    )


def _mrope_section(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """M-RoPE's sections, from 5.x `rope_parameters` or 4.x `rope_scaling` (type "mrope", which is
    otherwise plain RoPE: `_rope_fields` reads it as the default type)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = cfg.get(key)
        if isinstance(params, dict) and params.get("mrope_section"):
            return tuple(int(n) for n in params["mrope_section"])
    return None


def _rope_fields(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None]:
    """(global rope_theta, global scaling dict or None, local rope_theta for sliding layers)."""
    params = cfg.get("rope_parameters")
    local_theta = cfg.get("rope_local_base_freq")
    if isinstance(params, dict) and "full_attention" in params:  # 5.x nested per layer type
        local_theta = (params.get("sliding_attention") or {}).get("rope_theta", local_theta)
        params = params["full_attention"]
    scaling = dict(params) if isinstance(params, dict) else dict(cfg.get("rope_scaling") or {})
    theta = float(scaling.pop("rope_theta", cfg["rope_theta"]))
    rope_type = scaling.pop("type", None) or scaling.get("rope_type", "default")
    if rope_type == "mrope":  # transformers 4.x Qwen2-VL: default RoPE split into sections
        rope_type = "default"
    scaling.pop("mrope_section", None)  # kept apart (ModelArchConfig.mrope_section)
    scaling["rope_type"] = rope_type
    if rope_type == "default":
        return theta, None, local_theta
    if rope_type in ("llama3", "yarn"):  # transformers' standardize_rope_params (a top-level key wins)
        outside = cfg.get("original_max_position_embeddings")
        if outside is not None:
            scaling["original_max_position_embeddings"] = outside
        scaling.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    if rope_type == "yarn" and scaling.get("factor") is None:  # DeepSeek-style: the ratio of the two
        scaling["factor"] = cfg["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    return theta, scaling, local_theta


def _layer_types(
    family: str, cfg: dict[str, Any], num_layers: int
) -> tuple[tuple[LayerType, ...], int | None]:
    window = cfg.get("sliding_window")
    if family == "gemma3":
        if cfg.get("layer_types"):
            return tuple(cast(LayerType, t) for t in cfg["layer_types"]), int(window)
        pattern = int(cfg.get("sliding_window_pattern", 6))  # older configs: every 6th layer is global
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
        return tuple(cast(LayerType, t) for t in types), int(window)
    if family == "llama" and cfg.get("model_type") == "mistral" and window:
        return ("sliding_attention",) * num_layers, int(window)  # Mistral v0.1: every layer windowed
    # Qwen's optional sliding window is off in every released config (use_sliding_window: false).
    return (), None
