"""Server-sent events framing. Compact JSON, UTF-8 kept as is."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Send

from kvserve.serving.events import PrefillProgress

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# A client whose socket stays full this long has stopped reading: drop it (the reference's 2 s).
SEND_STALL_S = 2.0


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: Any) -> str:
    return f"data: {dumps(payload)}\n\n"


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


class _ClientStalled(Exception):
    pass


class SSEResponse(StreamingResponse):
    """A stream that ends, and aborts its generation, when the client stops reading for
    SEND_STALL_S instead of holding the request (and its KV blocks) for as long as it likes."""

    async def stream_response(self, send: Send) -> None:
        async def guarded_send(message: Message) -> None:
            try:
                async with asyncio.timeout(SEND_STALL_S):
                    await send(message)
            except TimeoutError:
                raise _ClientStalled() from None

        try:
            await super().stream_response(guarded_send)
        except _ClientStalled:
            logger.warning("client stopped reading for %.1f s; dropping the stream", SEND_STALL_S)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # aborts the engine request


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    return SSEResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
