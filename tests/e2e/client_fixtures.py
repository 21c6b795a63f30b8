"""Serving the first requests of real coding clients (tests/fixtures/clients) from a real engine:
the shared server fixture and the per-protocol checks of test_client_fixtures_*.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kvserve.models.aliases import list_known_models
from tests.api.conftest import parse_sse
from tests.live_uvicorn import serve_in_thread

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


@contextmanager
def serve_model(model: str, max_model_len: int) -> Iterator[str]:
    """`kvserve serve --model MODEL --ctx N` in this process (CPU, 4 sequences, 2048-token chunks)."""
    known = next(m for m in list_known_models() if m.name == model)
    if known.path is None:
        pytest.skip(f"{known.package} is not installed (make setup)")
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.config import EngineConfig, SchedulerConfig
    from kvserve.engine.build import build_engine
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings
    from kvserve.serving.segmenter import OutputSyntax

    config = EngineConfig(
        model=model,
        device="cpu",
        max_model_len=max_model_len,
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=2048),
    )
    core = build_engine(config, progress=False)
    engine = AsyncEngineClient(core)
    syntax = OutputSyntax.detect(core.loaded.tokenizer.chat_template)
    service = ChatService(
        engine,
        core.loaded.tokenizer,
        ChatServiceSettings(
            model_name=model, max_model_len=core.max_model_len, segmenter_factory=syntax.segmenter
        ),
    )
    app = create_app(service, ApiSettings(served_model_name=model))
    try:
        with serve_in_thread(app) as (url, _):
            yield url
    finally:
        engine.shutdown()


def post_fixture(url: str, path: str, fixture: str, **overrides: object) -> list[tuple[str | None, object]]:
    """POST a recorded first request (`overrides` replace its fields); its SSE frames. Prints the wall
    time (shown with -s): the long fixtures' figures in docs/clients.md."""
    body = {**json.loads((FIXTURES / fixture).read_text()), **overrides}
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=600) as client:
        response = client.post(path, json=body)
    print(f"\n{fixture} at {url}: {time.monotonic() - started:.1f} s")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(response.text)


def check_claude_code_stream(frames: list[tuple[str | None, object]], min_prompt_tokens: int) -> None:
    """A complete Anthropic Messages stream whose usage counts the rendered system prompt and tools."""
    names = [name for name, _ in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop")
    usage = frames[0][1]["message"]["usage"]  # type: ignore[index]
    # input_tokens leaves out the tokens read from the cache and those a disk tier writes to it.
    cached = usage["cache_read_input_tokens"] + usage.get("cache_creation_input_tokens", 0)
    assert usage["input_tokens"] + cached > min_prompt_tokens, usage


def check_codex_stream(frames: list[tuple[str | None, object]], min_prompt_tokens: int) -> None:
    """A complete Responses stream: created first, completed/incomplete last, sequence numbers in order."""
    types = [data["type"] for _, data in frames]  # type: ignore[index]
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    numbers = [data["sequence_number"] for _, data in frames]  # type: ignore[index]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert frames[-1][1]["response"]["usage"]["input_tokens"] > min_prompt_tokens  # type: ignore[index]
