"""Hostile clients against a real uvicorn socket (FakeEngine, kvserve's own HTTP settings): the cases of
`kvserve bench hostile` at small counts. Only 4xx or closed connections, nothing held, the server keeps
serving."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from collections.abc import Callable

import httpx
import pytest

from kvserve.api import http_server, sse
from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.bench import hostile
from kvserve.cli.embedded import serve_in_thread
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.conftest import MODEL, LiveServer, wait_until
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply


def _target(live_server: LiveServer) -> hostile.Target:
    return hostile.Target(live_server.url)


def _connections(live_server: LiveServer) -> int:
    return len(live_server.server.server_state.connections)


async def _connect(live_server: LiveServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", int(live_server.url.rsplit(":", 1)[1]))


async def _assert_still_serving(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        assert await hostile.still_serving(http, _target(live_server))


async def test_slowloris_heads_get_408_within_the_head_timeout(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 1.0)
    result = await hostile.slowloris_case(_target(live_server), num_connections=20, give_up_s=5.0)
    assert result.answers == {"408": 20}, result.answers
    assert result.seconds < 4.0
    await _assert_still_serving(live_server)


async def test_a_connection_that_sends_nothing_is_closed(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 0.5)
    reader, writer = await _connect(live_server)
    status = await asyncio.wait_for(reader.readline(), 3.0)
    assert status.startswith(b"HTTP/1.1 408")
    rest = await asyncio.wait_for(reader.read(), 3.0)  # returns at EOF only: the server closed it
    assert b"request head not received" in rest
    writer.close()


async def test_a_slow_request_head_within_the_timeout_is_served(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 2.0)
    reader, writer = await _connect(live_server)
    for part in (b"GET /health HTTP/1.1\r\n", b"host: x\r\n", b"\r\n"):
        writer.write(part)
        await asyncio.sleep(0.3)
    assert (await asyncio.wait_for(reader.readline(), 3.0)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_oversized_heads_are_431_and_closed(live_server: LiveServer) -> None:
    result = await hostile.oversized_head_case(_target(live_server))
    assert set(result.answers) <= {"431", "400", "closed"}, result.answers
    assert result.answers["431"] >= 6, result.answers
    await _assert_still_serving(live_server)


async def test_a_head_just_under_the_limit_is_served(live_server: LiveServer) -> None:
    headers = {"x-large": "a" * (http_server.MAX_HEAD_BYTES - 200)}
    assert await hostile._raw_request(_target(live_server), "GET", "/health", headers, b"") == "200"


async def test_oversized_bodies_are_413(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        result = await hostile.oversized_body_case(http, _target(live_server), 64 * 2**20)
    assert set(result.answers) <= {"413", "closed"} and result.answers["413"] >= 4, result.answers
    await _assert_still_serving(live_server)


async def test_a_body_that_stops_arriving_is_408(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvserve.api import body

    monkeypatch.setattr(body, "BODY_IDLE_TIMEOUT_S", 0.5)
    reader, writer = await _connect(live_server)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
    status = await asyncio.wait_for(reader.readline(), 3.0)
    assert status.startswith(b"HTTP/1.1 408"), status
    writer.close()


async def test_a_client_gone_mid_body_is_a_disconnect_not_an_error(
    live_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(3):
        _reader, writer = await _connect(live_server)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.close()
    await asyncio.sleep(0.5)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    await _assert_still_serving(live_server)


async def test_invalid_utf8_in_every_string_field_is_never_5xx(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        result = await hostile.invalid_utf8_case(http, _target(live_server))
    assert result.num_tried > 60
    assert result.num_5xx == 0 and result.num_hung == 0, result.answers
    assert set(result.answers) <= {"200", "400", "404"}, result.answers
    await _assert_still_serving(live_server)


def test_invalid_utf8_bodies_break_each_string_once() -> None:
    body = {"a": "x", "b": [{"c": "y"}], "n": 1}
    paths = [p for p, _ in hostile.invalid_utf8_bodies(body)]
    assert paths == ["$.a", "$.<key a>", "$.b[0].c", "$.b[0].<key c>", "$.<key b>", "$.<key n>"]
    for _path, raw in hostile.invalid_utf8_bodies(body):
        assert hostile.INVALID_UTF8 in raw
        with pytest.raises(UnicodeDecodeError):
            raw.decode()


async def test_deep_nesting_is_400(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        result = await hostile.deep_nesting_case(http, _target(live_server))
    assert result.answers == {"400": result.num_tried}, result.answers
    await _assert_still_serving(live_server)


async def test_connection_churn_leaves_nothing_behind(live_server: LiveServer) -> None:
    result = await hostile.churn_case(_target(live_server), num_connections=600)
    assert result.answers == {"dropped": 600}
    await wait_until(lambda: _connections(live_server) == 0, timeout=10.0)
    await wait_until(lambda: not live_server.engine.running, timeout=10.0)
    await _assert_still_serving(live_server)


def test_slow_readers_are_dropped_and_their_connections_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that never reads: the server stops writing (flow control), its watchdog ends the
    stream and the generation, and the socket is closed at once although its unsent bytes cannot
    drain (a plain close would keep it, its buffers and a descriptor for as long as the client lives)."""
    monkeypatch.setattr(sse, "SEND_STALL_S", 0.5)
    # Enough output to fill the kernel's buffers (server send buffers grow to 4 MiB here) fast.
    engine = FakeEngine(reply("x" * 300_000), token_delay_s=0)
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name=MODEL, max_model_len=10**6)
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name=MODEL))) as (url, server):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        body = json.dumps(
            {**hostile.chat_body("Hi", stream=True, max_tokens=300_000), "model": MODEL}
        ).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            _wait(lambda: engine.aborted, 20.0)
            assert not engine.running
            _wait(lambda: not server.server_state.connections, 3.0)
        finally:
            sock.close()
        with httpx.Client(timeout=10) as http:
            assert http.get(url + "/health").status_code == 200


def _wait(predicate: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
