"""Interleave an async iterator with heartbeats while it is silent (e.g. a long prefill)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def with_heartbeat(source: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
    """Yield the items of `source`, and None after every `interval_s` without one.

    The pending `__anext__` is never cancelled on a timeout (that would abort the engine
    request); it is cancelled only when our consumer goes away, which is meant to abort.
    """
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            future, pending = pending, None
            try:
                item = future.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
