"""A streaming client that stops reading (its socket stays full) is dropped and its generation aborted."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.types import Message

from kvserve.api import sse
from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.conftest import MODEL
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply


async def test_a_client_that_stops_reading_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "SEND_STALL_S", 0.1)
    engine = FakeEngine(reply("x" * 1000), token_delay_s=0.001)
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name=MODEL, max_model_len=4096)
    )
    app = create_app(service, ApiSettings(served_model_name=MODEL))
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "stream": True}).encode()
    requests = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client never hangs up
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and len(sent) > 4:
            await asyncio.Event().wait()  # ... but stops reading: every write blocks

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    started = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), 2.0)
    assert time.monotonic() - started < 1.0
    assert not engine.running and len(engine.aborted) == 1
    assert sent[0]["status"] == 200 and not any(m.get("more_body") is False for m in sent)
