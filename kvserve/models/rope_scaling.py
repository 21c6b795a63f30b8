"""The context a model runs at and the RoPE scaling that gets it there: `--ctx`, `--rope-scaling`,
`--rope-scale` and `--yarn-orig-ctx` applied to the model's own config, as llama.cpp and vLLM do.

Pure (no torch): the loader applies the plan to the architecture before it builds the model, so
the scaling is part of the model fingerprint and KV computed under other RoPE never mixes.

A `--ctx` past the trained context without an explicit method, on a model whose config does not
scale, adds YaRN *on demand*: the model keeps its own RoPE too, and a request runs scaled only
when its context needs it (engine/rope_regime.py decides). Static YaRN (llama.cpp's and vLLM's
default) cost every prompt, however short, +1.2% perplexity at x2 on SmolLM2 (docs/numerics.md).
An explicit `--rope-scaling`/`--rope-scale`, or a model's own scaling, stays static.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from kvserve.models.config import ModelArchConfig

RopeScalingName = Literal["none", "linear", "yarn"]

# Under on-demand scaling, a token that runs with the model's trained RoPE has this added to its
# rotary position(s) (engine/rope_regime.py; OnDemandRotary in layers/rotary.py takes it off). The
# regime rides in the positions tensor because that tensor already reaches the tables on every path:
# eager steps, the CUDA graphs' static input rows, tensor-parallel ranks. Positions stay far below it.
TRAINED_ROPE_OFFSET = 1 << 40


@dataclass(frozen=True)
class ContextRequest:
    """What the user asked for; every zero / None means "the model's own"."""

    max_model_len: int = 0  # --ctx; 0 = the model's context (or the original context x --rope-scale)
    rope_scaling: RopeScalingName | None = None  # None: the model's own, YaRN when --ctx asks for more
    rope_scale: float = 0.0  # --rope-scale; 0 = --ctx / the original context
    yarn_orig_ctx: int = 0  # --yarn-orig-ctx; 0 = the context the model was trained at


class ContextPlan(NamedTuple):
    arch: ModelArchConfig  # with the RoPE scaling the model runs with
    max_model_len: int
    notice: str | None  # the one warning worth logging (automatic YaRN, or a context past the scale)


class ContextError(ValueError):
    """A context or scaling the flags ask for that cannot be run; the message names the flag."""


def plan_context(arch: ModelArchConfig, request: ContextRequest) -> ContextPlan:
    """The architecture (with its final RoPE scaling) and context to run `arch` at, for `request`.

    Raises ContextError for what cannot be run: `--rope-scaling none` with a --ctx past the trained
    context, a --ctx past a linear/llama3 model's context without an explicit method, bad values."""
    _validate(request)
    explicit = request.rope_scaling is not None or request.rope_scale or request.yarn_orig_ctx
    if not explicit:
        return _model_own(arch, request.max_model_len)
    if request.rope_scaling == "none":
        return _unscaled(arch, request.max_model_len)
    return _scaled(arch, request.rope_scaling or "yarn", request)  # --rope-scale alone means YaRN


def trained_context(arch: ModelArchConfig) -> int:
    """The context before any scaling: the scaling's original context, else max_position_embeddings
    (divided by a linear factor, which HF configs fold into it)."""
    scaling = arch.rope_scaling_dict or {}
    if "original_max_position_embeddings" in scaling:
        return int(scaling["original_max_position_embeddings"])
    if scaling.get("rope_type") == "linear":
        return round(arch.max_position_embeddings / scaling["factor"])
    return arch.max_position_embeddings


def describe(arch: ModelArchConfig) -> str:
    """One phrase for logs: "rope none", "rope yarn x4 of 8192", "rope yarn x2 of 8192 on demand"."""
    scaling = arch.rope_scaling_dict
    if scaling is None:
        return "rope none"
    original = scaling.get("original_max_position_embeddings")
    phrase = f"rope {scaling['rope_type']} x{scaling['factor']:g}" + (f" of {original}" if original else "")
    return phrase + (" on demand" if arch.rope_scaling_on_demand else "")


def _validate(request: ContextRequest) -> None:
    if request.max_model_len < 0:
        raise ContextError(f"--ctx must be >= 0 (0 = the model's context), got {request.max_model_len}")
    if request.rope_scale and request.rope_scale < 1.0:
        raise ContextError(
            f"--rope-scale must be >= 1 (it multiplies the context), got {request.rope_scale:g}"
        )
    if request.yarn_orig_ctx < 0:
        raise ContextError(f"--yarn-orig-ctx must be > 0, got {request.yarn_orig_ctx}")
    if request.yarn_orig_ctx and request.rope_scaling in ("none", "linear"):
        raise ContextError(f"--yarn-orig-ctx applies to YaRN, not --rope-scaling {request.rope_scaling}")
    if request.rope_scale and request.rope_scaling == "none":
        raise ContextError("--rope-scale contradicts --rope-scaling none")


def _model_own(arch: ModelArchConfig, ctx: int) -> ContextPlan:
    context = arch.context_length
    if ctx <= context:
        return ContextPlan(arch, ctx or context, None)
    own = arch.rope_scaling_dict
    if own is not None and own["rope_type"] != "yarn":
        raise ContextError(
            f"--ctx {ctx} exceeds the model's context {context}, which already uses {own['rope_type']} "
            f"RoPE scaling; lower --ctx or replace it with --rope-scaling yarn (or linear)"
        )
    original = trained_context(arch)
    scaled = _with_scaling(arch, _yarn(own, ctx / original, original))
    if own is None:  # the model's own RoPE stays for the requests that fit its context
        scaled = dataclasses.replace(scaled, rope_scaling_on_demand=True)
        notice = (
            f"--ctx {ctx} exceeds the model's trained context {context}: extending it with YaRN RoPE "
            f"scaling (factor {ctx / original:g} over {original} tokens) on demand: a request whose prompt "
            f"and answer reserve fit {original} tokens runs as trained, a longer one scaled (which changes "
            f"its outputs a little); --rope-scaling yarn scales every request, --rope-scaling none refuses"
        )
        return ContextPlan(scaled, ctx, notice)
    notice = (
        f"--ctx {ctx} exceeds the model's trained context {context}: extending it with YaRN RoPE scaling "
        f"(factor {ctx / original:g} over {original} tokens), which changes its outputs a little at every "
        f"length; --rope-scaling none refuses instead, --ctx {context} keeps the model as trained"
    )
    return ContextPlan(scaled, ctx, notice)


def _unscaled(arch: ModelArchConfig, ctx: int) -> ContextPlan:
    original = trained_context(arch)
    if ctx > original:
        raise ContextError(
            f"--ctx {ctx} exceeds the model's trained context {original}, and --rope-scaling none forbids "
            f"extending it: lower --ctx to {original} or less, or drop --rope-scaling none (YaRN is then used)"
        )
    return ContextPlan(dataclasses.replace(arch, rope_scaling=None), ctx or original, None)


def _scaled(arch: ModelArchConfig, kind: RopeScalingName, request: ContextRequest) -> ContextPlan:
    original = request.yarn_orig_ctx or trained_context(arch)
    ctx = request.max_model_len
    factor = request.rope_scale or (ctx / original if ctx > original else 0.0)
    if not factor:
        raise ContextError(
            f"--rope-scaling {kind} needs --rope-scale F, or a --ctx above the original context {original}"
        )
    own = arch.rope_scaling_dict
    if kind == "linear":
        scaling: dict[str, Any] = {"rope_type": "linear", "factor": factor}
    else:
        scaling = _yarn(own, factor, original)
    covered = round(original * factor)
    notice = None
    if ctx > covered:
        notice = f"--ctx {ctx} exceeds the {covered} tokens --rope-scale {factor:g} covers: later positions extrapolate"
    return ContextPlan(_with_scaling(arch, scaling), ctx or covered, notice)


def _yarn(own: dict[str, Any] | None, factor: float, original: int) -> dict[str, Any]:
    """A YaRN scaling; a model's own YaRN keys (beta_fast, mscale, attention_factor, ...) are kept."""
    kept = own if own is not None and own["rope_type"] == "yarn" else {}
    return {**kept, "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}


def _with_scaling(arch: ModelArchConfig, scaling: dict[str, Any]) -> ModelArchConfig:
    return dataclasses.replace(arch, rope_scaling=tuple(sorted(scaling.items())))
