"""Server-sent events framing. Compact JSON, UTF-8 kept as is."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: Any) -> str:
    return f"data: {dumps(payload)}\n\n"


def event_frame(name: str, payload: Any) -> str:
    return f"event: {name}\ndata: {dumps(payload)}\n\n"


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
