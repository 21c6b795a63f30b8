"""AsyncEngineClient: the asyncio side of the engine thread.

The engine runs in its own thread so tokenization, rendering and HTTP never block a
step. The two sides exchange typed messages only: `_Add`/`_Abort`/`_Shutdown` go in
through a queue, `EngineOutput`s come back per request through asyncio queues.
Cancelling the consumer of `generate()` (client disconnect) aborts the request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.core import EngineCore
from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput, merge_outputs
from kvserve.engine.request import CheckpointHint, Request
from kvserve.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread failed; in-flight requests end with this error."""


@dataclass(frozen=True)
class _Add:
    request: Request
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[EngineOutput | BaseException]


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Shutdown:
    pass


_Message = _Add | _Abort | _Shutdown


class AsyncEngineClient:
    def __init__(self, core: EngineCore | None = None, *, build: Callable[[], EngineCore] | None = None):
        """Drive `core`, or the engine `build()` makes on the engine thread itself (what a server
        does: the thread that runs the steps is then the only one with an OpenMP team, see
        kvserve/openmp.py). `build`'s errors (SystemExit included) are raised here."""
        assert (core is None) != (build is None), "give core or build"
        self._inbox: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._streams: dict[str, _Add] = {}  # touched by the engine thread only
        self._dead: BaseException | None = None
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        if core is not None:
            self.core = core
        self._thread = threading.Thread(target=self._run, args=(build,), name="kvserve-engine", daemon=True)
        self._thread.start()
        if build is not None:
            self._built.wait()
            if self._build_error is not None:
                raise self._build_error

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncIterator[EngineOutput]:
        """Stream one request's outputs; raises PromptTooLongError (or ValueError: bad token ids or
        images) before queueing. `constraint` belongs to the engine thread from here on."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        request = self.core.make_request(
            request_id, prompt_token_ids, params, constraint, checkpoint_hint, images
        )
        outputs: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        self._inbox.put(_Add(request, asyncio.get_running_loop(), outputs))
        finished = False
        try:
            while not finished:
                output = merge_queued(await outputs.get(), outputs)
                finished = output.finished
                yield output
        finally:
            if not finished:  # consumer went away (disconnect, cancel, break)
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the engine thread; it saves to the disk tier first (EngineCore.shutdown)."""
        self._inbox.put(_Shutdown())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("engine thread still busy after %.0f s; exiting without waiting", timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._dead is None

    # -- engine thread -------------------------------------------------------------

    def _run(self, build: Callable[[], EngineCore] | None) -> None:
        if build is not None:
            try:
                self.core = build()
            except BaseException as error:  # noqa: BLE001 - raised again on the caller's thread
                self._build_error = error
                return
            finally:
                self._built.set()
        try:
            while self._handle_inbox(block=not self.core.has_unfinished_requests()):
                if self.core.has_unfinished_requests():
                    self._dispatch(self.core.step())
            self.core.shutdown()  # on the engine thread: it owns the KV pool being saved
        except BaseException as error:
            logger.exception("engine thread failed")
            self._dead = error
            for add in self._streams.values():
                add.loop.call_soon_threadsafe(add.outputs.put_nowait, error)
            self._streams.clear()

    def _handle_inbox(self, block: bool) -> bool:
        """Apply queued messages; wait for one when idle. False once shut down."""
        while True:
            try:
                message = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(message, _Shutdown):
                return False
            if isinstance(message, _Add):
                try:
                    self.core.add_request(message.request)
                except ValueError as error:  # a bad request fails alone, never the engine
                    message.loop.call_soon_threadsafe(message.outputs.put_nowait, error)
                    continue
                self._streams[message.request.request_id] = message
            elif message.request_id in self._streams:
                self.core.abort_request(message.request_id)

    def _dispatch(self, outputs: list[EngineOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Add, EngineOutput]]] = {}
        for output in outputs:
            add = self._streams.get(output.request_id)
            if add is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            by_loop.setdefault(add.loop, []).append((add, output))
        # One wake-up per event loop per step, not one per token.
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the consumer's loop closed: nobody is listening any more
                for add, output in items:
                    if not output.finished:
                        self._streams.pop(add.request.request_id, None)
                        self.core.abort_request(add.request.request_id)


def merge_queued(
    first: EngineOutput | BaseException,
    outputs: asyncio.Queue[EngineOutput | BaseException],
    checked: Callable[[EngineOutput | BaseException], EngineOutput] | None = None,
) -> EngineOutput:
    """`first` and whatever else is already queued (steps the consumer slept through), as one output
    (`merge_outputs`); `checked` raises a queued error (default: this module's). Shared by the
    engine clients (this one and `process_client.ProcessEngineClient`)."""
    checked = checked or _checked
    output = checked(first)
    if outputs.empty() or output.finished:  # the common case: the consumer kept up
        return output
    batch = [output]
    while not outputs.empty() and not batch[-1].finished:
        batch.append(checked(outputs.get_nowait()))
    return merge_outputs(batch)


def _checked(item: EngineOutput | BaseException) -> EngineOutput:
    if isinstance(item, ValueError):
        raise item
    if isinstance(item, BaseException):
        raise EngineDeadError(str(item)) from item
    return item


def _deliver(items: list[tuple[_Add, EngineOutput]]) -> None:
    for add, output in items:
        add.outputs.put_nowait(output)
