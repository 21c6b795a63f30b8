"""Fixtures: the app over a FakeEngine, in-process (httpx ASGI transport) or on a live uvicorn port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
import uvicorn

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.live_uvicorn import serve_in_thread

MODEL = "fake-model"


@dataclass
class Harness:
    engine: FakeEngine
    service: ChatService
    http: httpx.AsyncClient
    openai: openai.AsyncOpenAI
    anthropic: anthropic.AsyncAnthropic
    app: Any = None  # the FastAPI app itself (the cluster's ASGI bridge drives it directly)

    async def sse(self, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
        """POST a streaming request; return (event name, parsed data) per SSE frame, comments skipped."""
        response = await self.http.post(path, json=body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_sse(response.text)


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    frames = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "".join(line[6:] for line in lines if line.startswith("data: "))
        frames.append((name, data if data == "[DONE]" else json.loads(data)))
    return frames


def make_harness(
    engine: FakeEngine,
    ctx: int = 4096,
    keepalive_s: float = 5.0,
    segmenter_factory: Any = None,
    service_options: dict[str, Any] | None = None,
    tokenizer: Any = None,
    chat_settings: dict[str, Any] | None = None,
    **settings: Any,
) -> Harness:
    """`service_options` are further ChatService arguments (tool memory, live sequences),
    `chat_settings` further ChatServiceSettings fields, `settings` ApiSettings fields."""
    chat_settings = dict(chat_settings or {})
    if segmenter_factory is not None:
        chat_settings["segmenter_factory"] = segmenter_factory
    service_settings = ChatServiceSettings(
        model_name=MODEL, max_model_len=ctx, keepalive_s=keepalive_s, **chat_settings
    )
    tokenizer = tokenizer or FakeTokenizerInfo()
    service = ChatService(engine, tokenizer, service_settings, **(service_options or {}))
    app = create_app(service, ApiSettings(served_model_name=MODEL, **settings))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://kvserve")
    # The SDKs ship their own fork of httpx (httpx2); it has the same ASGI transport.
    sdk_http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://kvserve")
    return Harness(
        engine,
        service,
        http,
        openai.AsyncOpenAI(base_url="http://kvserve/v1", api_key="k", http_client=sdk_http, max_retries=0),
        anthropic.AsyncAnthropic(base_url="http://kvserve", api_key="k", http_client=sdk_http, max_retries=0),
        app,
    )


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = make_harness(FakeEngine(reply("Hello there!")))
    yield h
    await h.http.aclose()


@dataclass
class LiveServer:
    url: str
    engine: FakeEngine
    server: uvicorn.Server


@pytest.fixture
def live_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """uvicorn on a free 127.0.0.1 port in a thread; `request.param` is the FakeEngine (optional)."""
    engine = getattr(request, "param", None) or FakeEngine(reply("x" * 400), token_delay_s=0.005)
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name=MODEL, max_model_len=4096)
    )
    app = create_app(service, ApiSettings(served_model_name=MODEL))
    with serve_in_thread(app) as (url, server):
        yield LiveServer(url, engine, server)


async def wait_until(predicate: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)
