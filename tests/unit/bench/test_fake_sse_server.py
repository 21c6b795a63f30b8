"""The streaming client and `run_serve_bench` against a tiny scripted SSE server on a real socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from kvserve.bench.client import (
    STRICT,
    Api,
    HttpRequest,
    StreamRules,
    new_http_client,
    request_body,
    stream_request,
)
from kvserve.bench.datasets import BenchRequest
from kvserve.bench.metrics import RequestResult
from kvserve.bench.multiturn import MultiturnBench, MultiturnConfig, MultiturnTarget
from kvserve.bench.serve_bench import (
    LoadShape,
    ServeTarget,
    _shards,
    run_serve_bench,
    run_serve_bench_sharded,
)
from tests.live_uvicorn import serve_in_thread
from tests.unit.bench.char_tokenizer import CharTokenizer


def _chunk(content: str | None = None, finish: str | None = None) -> str:
    delta = {"content": content} if content is not None else {}
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
COMPLETE = [_chunk("a"), _chunk("b"), _chunk("c"), _chunk(finish="length"), USAGE, "[DONE]"]
SCRIPTS = {
    "ok": COMPLETE,
    "no-done": COMPLETE[:-1],
    "no-usage": [*COMPLETE[:4], "[DONE]"],
    "no-finish": [*COMPLETE[:3], USAGE, "[DONE]"],
    "error": [*COMPLETE[:2], json.dumps({"error": {"message": "out of KV blocks"}})],
}


def _sse_bytes(script: list[str]) -> bytes:
    return b"".join(f"data: {p}\n\n".encode() for p in script)


class Tracker:
    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []


def _app(tracker: Tracker) -> Starlette:
    async def scripted(request: Request) -> StreamingResponse | JSONResponse:
        name = request.path_params["scenario"]
        tracker.bodies.append(await request.json())
        if name == "http500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        payload = _sse_bytes(SCRIPTS[name])

        async def odd_splits() -> AsyncIterator[bytes]:
            # 7-byte writes: lines and events split at arbitrary points, several per write
            for i in range(0, len(payload), 7):
                yield payload[i : i + 7]
                await asyncio.sleep(0)

        return StreamingResponse(odd_splits(), media_type="text/event-stream")

    async def slow(request: Request) -> StreamingResponse:
        await request.json()
        tracker.in_flight += 1
        tracker.max_in_flight = max(tracker.max_in_flight, tracker.in_flight)

        async def body() -> AsyncIterator[bytes]:
            try:
                for p in COMPLETE:
                    await asyncio.sleep(0.02)
                    yield f"data: {p}\n\n".encode()
            finally:
                tracker.in_flight -= 1

        return StreamingResponse(body(), media_type="text/event-stream")

    async def agent(request: Request) -> StreamingResponse:
        body = await request.json()
        tracker.bodies.append(body)
        reply = f"reply {len(body['messages'])}"
        usage = {"prompt_tokens": 100, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 75}}
        script = [
            _chunk(reply),
            _chunk(finish="length"),
            json.dumps({"choices": [], "usage": usage}),
            "[DONE]",
        ]
        return StreamingResponse(iter([_sse_bytes(script)]), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/agent/v1/chat/completions", agent, methods=["POST"]),
            Route("/slow/v1/chat/completions", slow, methods=["POST"]),
            Route("/{scenario}/v1/chat/completions", scripted, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, Tracker]]:
    tracker = Tracker()
    with serve_in_thread(_app(tracker)) as (url, _):
        yield url, tracker


async def _one(url: str, rules: StreamRules = STRICT) -> RequestResult:
    async with new_http_client(timeout_s=10) as http:
        body = request_body(Api.CHAT, "hi", 3, logit_bias={"2": -100.0})
        return await stream_request(http, url, HttpRequest(Api.CHAT, body, prompt_len=2), rules)


async def test_complete_stream_split_at_odd_points(fake: tuple[str, Tracker]) -> None:
    url, tracker = fake
    r = await _one(f"{url}/ok")
    assert r.is_success, r.error
    assert r.generated_text == "abc" and r.output_len == 3 and r.prompt_len == 5
    body = tracker.bodies[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["logit_bias"] == {"2": -100.0} and body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("no-done", "without [DONE]"),
        ("no-usage", "no usage"),
        ("no-finish", "finish reason"),
        ("error", "out of KV blocks"),
        ("http500", "HTTP 500"),
    ],
)
async def test_incomplete_streams_are_rejected(fake: tuple[str, Tracker], scenario: str, reason: str) -> None:
    url, _ = fake
    r = await _one(f"{url}/{scenario}")
    assert not r.is_success
    assert reason in r.error


async def _closing_server(answer_from: int) -> tuple[asyncio.Server, str, list[int]]:
    """A raw HTTP server that reads each request and closes the connection without a response, from
    its `answer_from`-th connection on answers it with the complete stream."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen) + 1)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        if len(seen) >= answer_from:
            body = _sse_bytes(COMPLETE)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", seen


@pytest.mark.parametrize(
    ("answer_from", "succeeds"), [(2, True), (3, False)], ids=["retried", "twice-closed"]
)
async def test_a_connection_closed_before_any_answer_is_retried_once(
    answer_from: int, succeeds: bool
) -> None:
    """An HTTP server may close a pooled connection just as the client reuses it: the request is sent
    again on a new connection, once; a server that keeps closing is a failed request."""
    server, url, seen = await _closing_server(answer_from)
    async with server:
        r = await _one(url)
    assert len(seen) == 2
    assert r.is_success is succeeds, r.error
    if succeeds:
        assert r.generated_text == "abc"
    else:
        assert "RemoteProtocolError" in r.error


async def test_unreachable_server_is_a_failed_request() -> None:
    r = await _one("http://127.0.0.1:9")  # discard port: connection refused
    assert not r.is_success and "ConnectError" in r.error


async def test_serve_bench_respects_max_concurrency(fake: tuple[str, Tracker]) -> None:
    url, tracker = fake
    requests = [BenchRequest(f"prompt {i}", 2, 3) for i in range(6)]
    target = ServeTarget(f"{url}/slow", Api.CHAT)
    results, duration = await run_serve_bench(target, requests, LoadShape(max_concurrency=2), progress=False)
    assert all(r.is_success for r in results) and len(results) == 6
    assert tracker.max_in_flight == 2
    assert duration >= 3 * 6 * 0.02 * 0.9  # three waves of two, six 20 ms gaps each


def test_sharded_clients_split_the_load(fake: tuple[str, Tracker]) -> None:
    url, tracker = fake
    tracker.max_in_flight = 0
    requests = [BenchRequest(f"prompt {i}", 2, 3) for i in range(8)]
    target = ServeTarget(f"{url}/slow", Api.CHAT)
    results, duration = run_serve_bench_sharded(
        target, requests, LoadShape(max_concurrency=4, num_clients=2), progress=False
    )
    assert len(results) == 8 and all(r.is_success for r in results)
    assert 2 <= tracker.max_in_flight <= 4
    assert duration >= 2 * 6 * 0.02 * 0.9  # two waves of four, six 20 ms gaps each


def test_shards_deal_requests_and_split_concurrency() -> None:
    shards = _shards(7, LoadShape(request_rate=8.0, max_concurrency=3, num_clients=2))
    assert [indices for indices, _ in shards] == [[0, 2, 4, 6], [1, 3, 5]]
    assert [(s.max_concurrency, s.request_rate, s.num_clients) for _, s in shards] == [
        (2, 4.0, 1),
        (1, 4.0, 1),
    ]
    assert len(_shards(7, LoadShape(max_concurrency=1, num_clients=4))) == 1  # one stream: one client


def test_multiturn_sessions_grow_history_and_restart_between_turns(fake: tuple[str, Tracker]) -> None:
    url, tracker = fake
    tracker.bodies.clear()
    restarts: list[int] = []
    config = MultiturnConfig(
        num_agents=2, num_turns=3, prefix_tokens=300, user_tokens=20, output_tokens=2, restart_after_turn=1
    )
    bench = MultiturnBench(MultiturnTarget(f"{url}/agent"), CharTokenizer(), config, progress=False)
    results = bench.run(restart=lambda: restarts.append(len(tracker.bodies)))
    assert restarts == [2]  # after both agents' first turn, before any second turn
    assert [(r.turn, r.is_after_restart) for r in results] == [
        (1, False),
        (1, False),
        (2, True),
        (2, True),
        (3, True),
        (3, True),
    ]
    assert all(r.result.is_success and r.cached_ratio == 0.75 for r in results)
    last = [b for b in tracker.bodies if b["messages"][1]["content"].startswith("Agent 1:")][-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"] == "reply 2" and last[4]["content"] == "reply 4"
    assert len(last[0]["content"]) == 300 and last[5]["content"].startswith("Tool result (call_1_2")
