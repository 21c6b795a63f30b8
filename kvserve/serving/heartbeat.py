"""Interleave an async iterator with heartbeats on a fixed cadence (keepalives during a long prefill)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")


async def with_heartbeat(
    source: AsyncIterator[T], interval_s: float, until: Callable[[], bool] = lambda: False
) -> AsyncIterator[T | None]:
    """Yield the items of `source`, and a None every `interval_s` of wall time until `until()` holds
    after an item; from then on the items pass straight through. Beats cost a task and an
    `asyncio.wait` per item, which a stream of tokens (after the prefill) must not pay.

    Items do not reset the cadence: a source that reports progress every second still gets
    exactly one beat per interval, never a burst and never a gap of twice the interval.
    The pending `__anext__` is never cancelled on a timeout (that would abort the engine
    request); it is cancelled only when our consumer goes away, which is meant to abort.
    """
    loop = asyncio.get_running_loop()
    next_beat = loop.time() + interval_s
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            timeout = next_beat - loop.time()
            if timeout <= 0:
                next_beat = loop.time() + interval_s
                yield None
                continue
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                continue  # the beat is due: the next turn yields it
            future, pending = pending, None
            try:
                item = future.result()
            except StopAsyncIteration:
                return
            yield item
            if until():
                break
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
    async for item in source:
        yield item
