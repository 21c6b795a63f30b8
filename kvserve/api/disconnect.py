"""Abort non-streaming work when the client goes away (streams are cancelled by Starlette)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; cancel it (which aborts the engine request) as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    disconnected = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                disconnected.set()
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if disconnected.is_set():
            raise ClientDisconnected() from None
        raise
    finally:
        watcher.cancel()
