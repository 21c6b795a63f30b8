"""A recording reverse proxy for the real-client tests: clients (Claude Code, Codex) talk to it, it
forwards every request to the server unchanged and streams the answer back, and keeps each exchange
(method, path, status, both bodies) so the test can check what the client really sent and got."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.live_uvicorn import serve_in_thread

# Hop-by-hop or re-framed by the proxy: the body is streamed back chunked.
_DROPPED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Exchange:
    """One request through the proxy; `response_body` is complete once `is_finished`."""

    method: str
    path: str  # with the query string
    request_body: bytes
    status: int = 0
    content_type: str = ""
    response_body: bytes = b""
    is_finished: bool = False
    # Set once the proxy is done with the server's answer (read to its end, or failed).
    is_closed: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def request_json(self) -> Any:
        return json.loads(self.request_body) if self.request_body else None

    def sse_events(self) -> list[dict[str, Any]]:
        """The `data:` payloads of an SSE answer, in order ([DONE] left out)."""
        events = []
        for block in self.response_body.decode().replace("\r\n", "\n").split("\n\n"):
            data = "".join(line[6:] for line in block.split("\n") if line.startswith("data: "))
            if data and data != "[DONE]":
                events.append(json.loads(data))
        return events


class RecordingProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._pumps: set[asyncio.Future[None]] = set()  # strong references until each ends
        self.app = Starlette(routes=[Route("/{path:path}", self._forward, methods=_METHODS)])

    def take(self, timeout_s: float = 30.0) -> list[Exchange]:
        """The exchanges so far, in arrival order, each waited for (up to `timeout_s` in all) until
        the server's answer has been read to its end; the record starts again empty. A client can
        exit before the last bytes of its final answer reach the proxy."""
        with self._lock:
            taken, self.exchanges = self.exchanges, []
        deadline = time.monotonic() + timeout_s
        for exchange in taken:
            exchange.is_closed.wait(max(0.0, deadline - time.monotonic()))
        return taken

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        exchange = Exchange(request.method, path, body)
        with self._lock:
            self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED_HEADERS}
        client = httpx.AsyncClient(base_url=self.upstream, timeout=httpx.Timeout(900, connect=10))
        try:
            upstream = await client.send(
                client.build_request(request.method, path, headers=headers, content=body), stream=True
            )
        except BaseException:
            exchange.is_closed.set()
            await client.aclose()
            raise
        exchange.status = upstream.status_code
        exchange.content_type = upstream.headers.get("content-type", "")
        answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED_HEADERS}

        # The upstream answer is read to its end by a task of its own, whatever the client does: a
        # client may close its connection the moment it has what it needs (Codex does, on
        # `response.completed`), which cancels the relay below; the record must still say whether the
        # *server* finished its answer, not whether the client stayed to the end of the chunked body.
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def pump() -> None:
            received = []
            try:
                async for chunk in upstream.aiter_raw():
                    received.append(chunk)
                    chunks.put_nowait(chunk)
                exchange.is_finished = True
            finally:
                exchange.response_body = b"".join(received)
                chunks.put_nowait(None)
                await upstream.aclose()
                await client.aclose()
                exchange.is_closed.set()

        pumping = asyncio.ensure_future(pump())
        self._pumps.add(pumping)
        pumping.add_done_callback(self._pumps.discard)

        async def relay() -> AsyncIterator[bytes]:
            while (chunk := await chunks.get()) is not None:
                yield chunk

        return StreamingResponse(relay(), status_code=upstream.status_code, headers=answer_headers)


_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]


@contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, RecordingProxy]]:
    """A proxy to `upstream` on a free loopback port for the block's duration: (its URL, the proxy)."""
    proxy = RecordingProxy(upstream)
    with serve_in_thread(proxy.app) as (url, _):
        yield url, proxy
