"""The shared middle of every generation route: prepare off the loop, then stream or collect."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from kvserve.api.access_log import request_id_of
from kvserve.api.disconnect import cancel_on_disconnect
from kvserve.api.errors import ApiError
from kvserve.chat.conversation import ChatRequest
from kvserve.serving.chat_service import ChatService, PreparedRequest
from kvserve.serving.events import GenerationEvent
from kvserve.serving.result import GenerationResult, collect


class StreamEncoder(Protocol):
    def start(self) -> list[str]: ...

    def encode(self, event: GenerationEvent) -> list[str]: ...


def chat_service(request: Request) -> ChatService:
    return request.app.state.chat_service


def generate(request: Request, prepared: PreparedRequest) -> AsyncIterator[GenerationEvent]:
    """The request's event stream, observed for /metrics."""
    return request.app.state.metrics.observe(chat_service(request).generate(prepared))


async def to_chat(request: Request, adapter: Callable[..., ChatRequest], *args: Any) -> ChatRequest:
    """Wire -> ChatRequest in a worker thread: adapters decode images, up to 16 of 40 megapixels
    each by default, under the server's image limits."""
    limits = request.app.state.settings.image_limits
    return await run_in_threadpool(adapter, *args, image_limits=limits)


async def prepare(
    request: Request, fn: Callable[..., PreparedRequest], item: object, **kwargs: Any
) -> PreparedRequest:
    """Render and tokenize in a worker thread: a 100K-token prompt must not stall other streams.
    The engine request id carries the HTTP request id, so logs on both sides line up."""
    return await run_in_threadpool(fn, item, request_id=request_id_of(request.scope), **kwargs)


async def encode_stream(encoder: StreamEncoder, events: AsyncIterator[GenerationEvent]) -> AsyncIterator[str]:
    for frame in encoder.start():
        yield frame
    try:
        async for event in events:
            for frame in encoder.encode(event):
                yield frame
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # a disconnect aborts the engine request


async def complete(request: Request, events: AsyncIterator[GenerationEvent]) -> GenerationResult:
    result = await cancel_on_disconnect(request, collect(events))
    if result.error is not None:
        raise ApiError(500, result.error)
    return result
