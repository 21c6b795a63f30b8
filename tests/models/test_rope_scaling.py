"""RoPE context extension: YaRN and linear scaling against transformers' ROPE_INIT_FUNCTIONS and
models, and the context plan the --ctx / --rope-scaling / --rope-scale / --yarn-orig-ctx flags make."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from kvserve.models.config import ModelArchConfig, arch_config_from_hf
from kvserve.models.fingerprint import model_fingerprint
from kvserve.models.layers.rotary import MRotaryEmbedding, OnDemandRotary, RotaryEmbedding, rope_init
from kvserve.models.loader.safetensors import load_hf_model
from kvserve.models.rope_scaling import (
    TRAINED_ROPE_OFFSET,
    ContextError,
    ContextRequest,
    describe,
    plan_context,
)
from tests.models.helpers import TINY, PagedDriver, make_tiny_hf_model, tiny_hf_config

LOGITS_ATOL = 1e-4

YARN_VARIANTS = [
    {},
    {"truncate": False},
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"mscale": 1.0, "mscale_all_dim": 0.707},  # DeepSeek-style: attention factor = ratio of mscales
    {"attention_factor": 0.9},
]


def _hf_llama_config(rope_scaling: dict | None, **overrides: object):  # -> transformers.LlamaConfig
    import transformers

    fields = {**TINY, "head_dim": 16, "rope_theta": 10_000.0, **overrides}
    return transformers.LlamaConfig(**fields, rope_scaling=rope_scaling)


@pytest.mark.parametrize("extra", YARN_VARIANTS)
def test_yarn_init_matches_transformers(extra: dict) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, **extra}
    config = _hf_llama_config(dict(scaling), head_dim=64, rope_theta=100_000.0, max_position_embeddings=8192)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = rope_init(64, 100_000.0, scaling)
    assert torch.equal(ours.inv_freq, inv_freq) and ours.attention_factor == attention_factor
    assert attention_factor != 1.0


def test_rotary_tables_carry_the_attention_factor() -> None:
    """cos/sin as transformers' LlamaRotaryEmbedding computes them (both times the mscale)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    hf = LlamaRotaryEmbedding(_hf_llama_config(dict(scaling)))
    positions = torch.tensor([0, 5, 63, 64, 200, 255])
    want_cos, want_sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = RotaryEmbedding(16, 10_000.0, scaling)(positions, torch.float32)
    assert hf.attention_scaling > 1.0
    torch.testing.assert_close(cos[:, 0], want_cos[0], atol=0, rtol=0)
    half = 8  # ours carries sin's first half negated (see rotary.py)
    torch.testing.assert_close(
        torch.cat((-sin[:, 0, :half], sin[:, 0, half:]), -1), want_sin[0], atol=0, rtol=0
    )


def _hf_logits(hf: torch.nn.Module, tokens: list[int], offset: int = 0) -> torch.Tensor:
    position_ids = torch.arange(offset, offset + len(tokens))[None]
    with torch.no_grad():
        return hf(torch.tensor([tokens]), position_ids=position_ids).logits[0].float()


def test_auto_yarn_model_matches_transformers_past_the_trained_context(tmp_path: Path) -> None:
    """--ctx 4x the trained context: the model kvserve builds is transformers' model with
    rope_scaling yarn x4, at positions far past the trained context (decode included)."""
    import transformers

    hf = make_tiny_hf_model("llama_tied", seed=4)  # max_position_embeddings 256
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_hf_model(tmp_path, torch.float32, context=ContextRequest(max_model_len=1024))
    assert ours.arch.rope_scaling_dict == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    config = tiny_hf_config("llama_tied")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    config.rope_parameters = {**yarn, "rope_theta": config.rope_parameters["rope_theta"]}
    hf_yarn = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf_yarn.load_state_dict(hf.state_dict())
    tokens = torch.randint(0, 384, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    offset = 900
    expected = _hf_logits(hf_yarn, tokens, offset)
    assert (expected - _hf_logits(hf, tokens, offset)).abs().max() > 1e-2  # the scaling matters
    driver = PagedDriver(ours.model, position_offset=offset)
    got = torch.cat([driver.step([(0, tokens[:16])]), *(driver.step([(0, [t])]) for t in tokens[16:])])
    torch.testing.assert_close(got, expected, atol=LOGITS_ATOL, rtol=0)


def test_scaling_changes_the_fingerprint(tmp_path: Path) -> None:
    make_tiny_hf_model("llama_tied").save_pretrained(tmp_path, safe_serialization=True)
    plain = load_hf_model(tmp_path, torch.float32)
    yarn = load_hf_model(tmp_path, torch.float32, context=ContextRequest(max_model_len=1024))
    yarn8 = load_hf_model(tmp_path, torch.float32, context=ContextRequest(max_model_len=2048))
    linear = load_hf_model(tmp_path, torch.float32, context=ContextRequest(1024, "linear"))
    assert len({plain.fingerprint, yarn.fingerprint, yarn8.fingerprint, linear.fingerprint}) == 4
    same = load_hf_model(tmp_path, torch.float32, context=ContextRequest(max_model_len=128))
    assert same.fingerprint == plain.fingerprint  # a shorter context runs the model as trained


# -- the context plan ------------------------------------------------------------------------


def _arch(rope_scaling: dict | None = None, max_position_embeddings: int = 8192) -> ModelArchConfig:
    hf = {
        "model_type": "llama",
        **TINY,
        "max_position_embeddings": max_position_embeddings,
        "rope_scaling": rope_scaling,
    }
    return arch_config_from_hf(hf)


def test_ctx_within_the_trained_context_keeps_the_model() -> None:
    arch = _arch()
    assert plan_context(arch, ContextRequest()) == (arch, 8192, None)
    assert plan_context(arch, ContextRequest(4096)) == (arch, 4096, None)


def test_ctx_above_the_trained_context_enables_yarn_with_one_warning() -> None:
    plan = plan_context(_arch(), ContextRequest(32768))
    assert plan.max_model_len == 32768 and plan.arch.context_length == 32768
    assert plan.arch.rope_scaling_dict == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert plan.notice is not None and "YaRN" in plan.notice and "--rope-scaling none" in plan.notice
    # On demand: the model keeps its own RoPE for requests that fit 8192 (engine/rope_regime.py).
    assert plan.arch.rope_scaling_on_demand and "on demand" in plan.notice
    assert describe(plan.arch) == "rope yarn x4 of 8192 on demand"
    assert plan.arch.trained_arch == _arch()


def test_explicit_yarn_and_a_models_own_scaling_stay_static() -> None:
    explicit = plan_context(_arch(), ContextRequest(32768, "yarn"))
    assert not explicit.arch.rope_scaling_on_demand and describe(explicit.arch) == "rope yarn x4 of 8192"
    qwen = _arch({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768)
    assert not plan_context(qwen, ContextRequest(262144)).arch.rope_scaling_on_demand
    # Both regimes' scaled arithmetic is the same: the fingerprint does not tell them apart.
    on_demand = plan_context(_arch(), ContextRequest(32768)).arch
    assert dataclasses.replace(on_demand, rope_scaling_on_demand=False) == explicit.arch


def _rope_pair(mrope: bool) -> tuple[RotaryEmbedding, RotaryEmbedding]:
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    if mrope:
        return MRotaryEmbedding(16, 10_000.0, yarn, (2, 3, 3)), MRotaryEmbedding(
            16, 10_000.0, None, (2, 3, 3)
        )
    return RotaryEmbedding(16, 10_000.0, yarn), RotaryEmbedding(16, 10_000.0, None)


@pytest.mark.parametrize("layout", ["plain", "mrope-text", "mrope-grid"])
def test_on_demand_rotary_rows_take_their_own_regimes_tables(layout: str) -> None:
    """Each row's cos/sin are bit for bit those of its regime's embedding alone (the YaRN attention
    factor with the scaled ones), whatever the other rows of the batch run with."""
    scaled, trained = _rope_pair(layout != "plain")
    rotary = OnDemandRotary(scaled, trained)
    positions = torch.tensor([0, 5, 63, 64, 300, 2000])
    if layout == "mrope-grid":
        positions = torch.stack([positions, positions + 1, positions + 2])  # [3, num_tokens]
    is_trained = torch.tensor([True, False, True, False, True, False])
    cos, sin = rotary(positions + is_trained * TRAINED_ROPE_OFFSET, torch.float32)
    for rows, embedding in ((is_trained, trained), (~is_trained, scaled)):
        want_cos, want_sin = embedding(positions[..., rows], torch.float32)
        assert torch.equal(cos[rows], want_cos) and torch.equal(sin[rows], want_sin)
    assert not torch.equal(trained(positions, torch.float32)[0], scaled(positions, torch.float32)[0])
    for offset, embedding in ((TRAINED_ROPE_OFFSET, trained), (0, scaled)):  # one regime: one table
        got, want = rotary(positions + offset, torch.float32), embedding(positions, torch.float32)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rope_scaling_none_refuses_a_longer_ctx_naming_the_flag() -> None:
    with pytest.raises(ContextError, match="--rope-scaling none"):
        plan_context(_arch(), ContextRequest(32768, "none"))
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    plan = plan_context(
        _arch({**llama3, "original_max_position_embeddings": 8192}, 131072), ContextRequest(0, "none")
    )
    assert plan.arch.rope_scaling is None and plan.max_model_len == 8192  # the model's own scaling removed


def test_a_model_with_its_own_scaling_is_honoured_and_not_stacked() -> None:
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    arch = _arch({**llama3, "original_max_position_embeddings": 8192}, 131072)
    assert plan_context(arch, ContextRequest()).max_model_len == 131072
    with pytest.raises(ContextError, match="already uses llama3.*--rope-scaling yarn"):
        plan_context(arch, ContextRequest(262144))
    # Qwen's YaRN configs keep max_position_embeddings at the original context.
    qwen = _arch(
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 16}, 32768
    )
    assert plan_context(qwen, ContextRequest()).max_model_len == 131072
    longer = plan_context(qwen, ContextRequest(262144))
    assert longer.arch.rope_scaling_dict == {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 32768,
        "beta_fast": 16,
    }


def test_explicit_scaling_flags() -> None:
    arch = _arch()
    linear = plan_context(arch, ContextRequest(rope_scaling="linear", rope_scale=2.0))
    assert linear.max_model_len == 16384 and linear.arch.rope_scaling_dict == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    yarn = plan_context(arch, ContextRequest(20000, "yarn", yarn_orig_ctx=4096))
    assert yarn.arch.rope_scaling_dict["factor"] == 20000 / 4096
    assert yarn.arch.rope_scaling_dict["original_max_position_embeddings"] == 4096
    scale_only = plan_context(arch, ContextRequest(rope_scale=4.0))  # --rope-scale alone: YaRN
    assert scale_only.max_model_len == 32768 and scale_only.arch.rope_scaling_dict["rope_type"] == "yarn"
    past = plan_context(arch, ContextRequest(65536, "linear", rope_scale=2.0))
    assert past.max_model_len == 65536 and past.notice is not None and "extrapolate" in past.notice


@pytest.mark.parametrize(
    ("request_", "flag"),
    [
        (ContextRequest(rope_scaling="yarn"), "--rope-scale F"),
        (ContextRequest(rope_scale=0.5), "--rope-scale must be >= 1"),
        (ContextRequest(rope_scaling="linear", yarn_orig_ctx=4096), "--yarn-orig-ctx"),
        (ContextRequest(rope_scaling="none", rope_scale=2.0), "--rope-scale contradicts"),
        (ContextRequest(-1), "--ctx must be >= 0"),
    ],
)
def test_bad_flag_combinations_name_the_flag(request_: ContextRequest, flag: str) -> None:
    with pytest.raises(ContextError, match=flag.replace("+", r"\+")):
        plan_context(_arch(), request_)


def test_hf_yarn_config_fields_follow_transformers() -> None:
    """original_max_position_embeddings defaults to max_position_embeddings (a top-level key wins),
    and a missing factor is their ratio (DeepSeek), as transformers' standardize_rope_params does."""
    arch = _arch({"rope_type": "yarn", "factor": 2.0}, 4096)
    assert arch.rope_scaling_dict == {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 4096,
    }
    hf = {
        "model_type": "llama",
        **TINY,
        "max_position_embeddings": 16384,
        "original_max_position_embeddings": 4096,
    }
    deepseek_style = arch_config_from_hf({**hf, "rope_scaling": {"rope_type": "yarn", "factor": None}})
    assert deepseek_style.rope_scaling_dict["factor"] == 4.0
    assert deepseek_style.context_length == 16384


def test_fingerprint_covers_the_arch_scaling() -> None:
    arch = _arch()
    scaled = dataclasses.replace(arch, rope_scaling=(("factor", 4.0), ("rope_type", "linear")))
    tensors = [("w", torch.ones(2))]
    assert model_fingerprint(arch, torch.float32, tensors) != model_fingerprint(
        scaled, torch.float32, tensors
    )
