"""Server-sent events framing. Compact JSON, UTF-8 kept as is."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from kvserve.serving.events import PrefillProgress

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# A client whose socket stays full this long has stopped reading: drop it (the reference's 2 s).
SEND_STALL_S = 2.0
# The ASGI scope extension (kvserve's HTTP protocol, api/http_server.py) that closes the connection at
# once, dropping the bytes its client never read: a plain close would wait for them to drain, so a
# client that never reads would keep the socket, its buffers and a descriptor for ever.
ABORT_CONNECTION = "kvserve.abort_connection"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: Any) -> str:
    return f"data: {dumps(payload)}\n\n"


class FrameTemplate:
    """A `data:` frame whose payload varies in one string only (a token's text), serialized once
    around a marker: each token then costs one string escape and a concatenation instead of a
    dict build and a full `json.dumps`. Byte-identical to `data_frame` of the same payload."""

    MARKER = "\x00kvserve-frame-slot\x00"

    def __init__(self, payload: Any):
        head, _, tail = dumps(payload).partition(dumps(self.MARKER))
        assert _, "the payload must hold FrameTemplate.MARKER once"
        self._head, self._tail = "data: " + head, tail + "\n\n"

    def frame(self, value: str) -> str:
        return self._head + dumps(value) + self._tail


def event_frame(name: str, payload: Any) -> str:
    return f"event: {name}\ndata: {dumps(payload)}\n\n"


def prefill_comment(progress: PrefillProgress) -> str:
    """A keepalive, or, when the request asked for progress, the counts as JSON in a comment
    (`: prefill_progress {...}`): SSE parsers skip comments, so every protocol's stream stays
    what its SDK expects. Field names follow llama-server's `prompt_progress`; `processed`
    counts the prompt tokens whose KV is ready, cached ones included."""
    if not progress.is_detailed:
        return KEEPALIVE
    counts = {
        "total": progress.num_prompt_tokens,
        "cache": progress.num_cached_tokens,
        "processed": progress.num_computed_tokens,
        "time_ms": round(progress.elapsed_s * 1000),
    }
    return f": prefill_progress {dumps(counts)}\n\n"


class SSEResponse(StreamingResponse):
    """A stream that ends, and aborts its generation, when the client stops reading for
    SEND_STALL_S instead of holding the request (and its KV blocks) for as long as it likes.

    One watchdog timer per stream looks at the send in progress every SEND_STALL_S / 4; a send itself
    only stamps its start (a timeout context per frame cost ~10% of the event loop at 256 streams)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._abort_connection = (scope.get("extensions") or {}).get(ABORT_CONNECTION)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        send_started: float | None = None
        scope = anyio.CancelScope()
        period = SEND_STALL_S / 4

        def watch() -> None:
            nonlocal timer
            if send_started is not None and loop.time() - send_started >= SEND_STALL_S:
                scope.cancel()
            else:
                timer = loop.call_later(period, watch)

        async def stamped_send(message: Message) -> None:
            nonlocal send_started
            send_started = loop.time()
            await send(message)
            send_started = None

        timer = loop.call_later(period, watch)
        try:
            with scope:
                await super().stream_response(stamped_send)
            if scope.cancelled_caught:
                logger.warning("client stopped reading for %.1f s; dropping the stream", SEND_STALL_S)
                if self._abort_connection is not None:
                    self._abort_connection()
        finally:
            timer.cancel()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # aborts the engine request


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    return SSEResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
