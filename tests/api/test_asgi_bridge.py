"""The cluster replica's ASGI bridge over the real app (FakeEngine): the same bytes as a direct
request, streamed piece by piece, and closing it early aborts the engine request."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from kvserve.cluster.asgi_bridge import ForwardedRequest, ReplyHead, stream_asgi
from kvserve.cluster.routing_keys import replica_tag_of, response_id_prefix
from tests.api.conftest import make_harness, parse_sse, wait_until
from tests.api.fake_engine import FakeEngine, reply

# What differs between two runs of one request: uuid-based ids and timestamps.
_IDS = re.compile(rb'[0-9a-f]{32}|"(created|created_at)":\d+')


def _forwarded(path: str, body: dict[str, Any]) -> ForwardedRequest:
    data = json.dumps(body).encode()
    headers = ((b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()))
    return ForwardedRequest("POST", path, b"", headers, data, ("127.0.0.1", 5000))


async def _pieces(app: Any, request: ForwardedRequest) -> tuple[ReplyHead, list[bytes]]:
    pieces = [piece async for piece in stream_asgi(app, request, "tag1")]
    head, *body = pieces
    assert isinstance(head, ReplyHead) and all(isinstance(p, bytes) for p in body)
    return head, body


async def test_streams_match_the_direct_reply_in_all_three_apis() -> None:
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True}),
        ("/v1/responses", {"input": "hi", "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ]
    for path, body in cases:
        # Two servers: the second request of one would find the first's prefix cached.
        harness, other = (make_harness(FakeEngine(reply("Hello there, friend!"))) for _ in range(2))
        direct = await other.http.post(path, json={"model": "m", **body})
        head, chunks = await _pieces(harness.app, _forwarded(path, {"model": "m", **body}))
        assert head.status == direct.status_code == 200
        assert dict(head.headers)[b"content-type"].decode() == direct.headers["content-type"]
        assert _IDS.sub(b"", b"".join(chunks)) == _IDS.sub(b"", direct.content), path
        await harness.http.aclose()
        await other.http.aclose()


async def test_a_stream_arrives_piece_by_piece() -> None:
    harness = make_harness(FakeEngine(reply("abcdefghij" * 3), token_delay_s=0.02))
    request = _forwarded(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    head, chunks = await _pieces(harness.app, request)
    frames = parse_sse(b"".join(chunks).decode())
    assert head.status == 200 and len(chunks) >= len(frames) - 2 > 10  # not one buffered body


async def test_a_consumer_that_falls_behind_gets_the_waiting_events_in_one_piece() -> None:
    """Ray's stream costs CPU per item: events queued while its consumer was busy go together, and
    the bytes are those of a consumer that keeps up."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    fast = make_harness(FakeEngine(reply("abcdefghij" * 3), token_delay_s=0.01))
    _, fast_chunks = await _pieces(fast.app, _forwarded("/v1/chat/completions", body))
    slow = make_harness(FakeEngine(reply("abcdefghij" * 3), token_delay_s=0.01))
    slow_chunks = []
    async for piece in stream_asgi(slow.app, _forwarded("/v1/chat/completions", body), "tag1"):
        if isinstance(piece, bytes):
            slow_chunks.append(piece)
        await asyncio.sleep(0.1)  # a busy consumer: ~10 events wait each time
    assert _IDS.sub(b"", b"".join(slow_chunks)) == _IDS.sub(b"", b"".join(fast_chunks))
    assert len(slow_chunks) * 3 < len(fast_chunks), (len(slow_chunks), len(fast_chunks))
    await fast.http.aclose()
    await slow.http.aclose()


async def test_closing_the_stream_aborts_the_engine_request() -> None:
    engine = FakeEngine(reply("x" * 400), token_delay_s=0.01)
    harness = make_harness(engine)
    request = _forwarded(
        "/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 999, "stream": True}
    )
    stream = stream_asgi(harness.app, request)
    assert isinstance(await anext(stream), ReplyHead)
    await anext(stream)
    await stream.aclose()
    await wait_until(lambda: len(engine.aborted) == 1, timeout=1.0)
    assert not engine.running


async def test_a_bad_body_is_the_protocols_4xx() -> None:
    harness = make_harness(FakeEngine(reply("x")))
    broken = ForwardedRequest("POST", "/v1/messages", b"", (), b"{not json", None)
    head, chunks = await _pieces(harness.app, broken)
    assert head.status == 400 and json.loads(b"".join(chunks))["type"] == "error"


async def test_responses_ids_name_the_replica() -> None:
    harness = make_harness(FakeEngine(reply("ok")), response_id_prefix=response_id_prefix("abc123"))
    _, chunks = await _pieces(harness.app, _forwarded("/v1/responses", {"input": "hi"}))
    assert replica_tag_of(json.loads(b"".join(chunks))["id"]) == "abc123"
