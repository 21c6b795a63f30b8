"""Drive an ASGI app (kvserve's FastAPI app) with one forwarded HTTP request and stream its reply
back as typed pieces: a `ReplyHead`, then body chunks as the app sends them (no buffering, unlike
httpx's ASGI transport). Closing the stream early is the client going away: the app receives
`http.disconnect`, which is how a real server tells it, so its streams abort their engine requests
exactly as behind uvicorn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

logger = logging.getLogger(__name__)

# How long the app may take to wind down after a disconnect before it is cancelled outright.
_DISCONNECT_GRACE_S = 2.0


@dataclass(frozen=True)
class ForwardedRequest:
    """One HTTP request as the ingress received it (header names lower-case bytes)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None = None


@dataclass(frozen=True)
class ReplyHead:
    """The reply's status line and headers, and which replica answered."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    replica_tag: str = ""


def _scope(request: ForwardedRequest) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string,
        "root_path": "",
        "headers": list(request.headers),
        "client": request.client,
        "server": ("kvserve-replica", 0),
        "state": {},
    }


async def stream_asgi(
    app: ASGIApp, request: ForwardedRequest, replica_tag: str = ""
) -> AsyncIterator[ReplyHead | bytes]:
    """The app's reply: one `ReplyHead`, then the non-empty body chunks in order."""
    outbox: asyncio.Queue[Message | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive() -> Message:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()  # as a server: the next message is the client leaving
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await outbox.put(message)

    task = asyncio.create_task(app(_scope(request), receive, send))
    task.add_done_callback(lambda _: outbox.put_nowait(None))
    finished = False
    held: list[Message | None] = []  # a message taken while joining bodies, not a body itself
    try:
        while True:
            message = held.pop() if held else await outbox.get()
            if message is None:
                task.result()  # the app's own exception, if it raised past its handlers
                raise RuntimeError("the app returned without finishing its response")
            if message["type"] == "http.response.start":
                headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
                yield ReplyHead(message["status"], headers, replica_tag)
            elif message["type"] == "http.response.body":
                body, more = _join_queued_bodies(message, outbox, held)
                if body:
                    yield body
                if not more:
                    finished = True
                    return
    finally:
        disconnected.set()
        if not finished:
            await _wind_down(task)


def _join_queued_bodies(
    message: Message, outbox: asyncio.Queue[Message | None], held: list[Message | None]
) -> tuple[bytes, bool]:
    """The body of `message` and of the body messages already queued behind it, as one piece, and
    whether more follows. Each piece is one item of Ray's stream, which costs the cluster ~1 ms of CPU
    (docs/cluster.md): when the stream falls behind the app (a busy host), the SSE events waiting are
    sent together; nothing waits for more, so a stream that keeps up is sent event by event. A
    message that is not a body is put in `held` for the caller."""
    body = bytearray(message.get("body") or b"")
    more = message.get("more_body", False)
    while more and not outbox.empty():
        queued = outbox.get_nowait()
        if queued is None or queued["type"] != "http.response.body":
            held.append(queued)
            break
        body += queued.get("body") or b""
        more = queued.get("more_body", False)
    return bytes(body), more


async def _wind_down(task: asyncio.Task[None]) -> None:
    """Let the app see the disconnect (its streams abort their engine requests), then cancel it."""
    if task.done():
        return
    try:
        await asyncio.wait({task}, timeout=_DISCONNECT_GRACE_S)
    finally:
        if not task.done():
            logger.warning(
                "the app did not end %.0f s after a disconnect; cancelling it", _DISCONNECT_GRACE_S
            )
            task.cancel()
