"""The API front end's side of the engine process: `EngineLink` (one pipe to it) and
`ProcessEngineClient` (a link that also starts and stops the process).

vLLM's and SGLang's split. In one process the engine thread and the event loop share
one GIL, and on a fast GPU the loop's per-stream socket work stretches every decode step. Here
the engine process (`engine_process.py`) only schedules, runs the model and ships each step's
token ids; a front end (HTTP, rendering, detokenization, SSE) talks to it through typed messages
over a pipe (`ipc.py`). A link has `AsyncEngineClient`'s interface, so `ChatService` cannot tell
them apart. With `num_front_ends` > 1 the process gets one pipe per front end: this one's is the
first, `peer_conns` are the others', for the front-end processes `kvserve serve --api-servers`
starts (`EngineLink(conn)` in each).

- `build` (picklable, e.g. a `functools.partial` of a module-level function) builds the
  `EngineCore` in the child; `answer(core, query)` (picklable) answers `query(query)` there (a
  typed query, e.g. `cli.engine_host`'s), on a thread of its own, as the HTTP threads read the
  in-process engine (web console, metrics).
- A token constraint crosses as its recipe (`constraint.recipe`, `grammar.constraint`), rebuilt
  against the engine's tokenizer in the child.
- The disk tier's per-request prompt source comes back as an event (`on_source`).
- Between front ends: `tell(message)` reaches every other front end's `on_told`; `gather(question)`
  returns every other front end's `on_ask(question)`.
- The child ends when the first pipe closes (the server exited) or on `shutdown()`, after the
  engine's own shutdown (the disk tier's shutdown saves).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvserve.engine import ipc
from kvserve.engine.client import EngineDeadError, merge_queued
from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.engine_process import Answer, engine_main
from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint
from kvserve.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from kvserve.engine.core import EngineCore

logger = logging.getLogger(__name__)

SourceCallback = Callable[[str, int, int, "str | None"], None]
_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[EngineOutput | BaseException]"]


class EngineStartError(RuntimeError):
    """The engine process could not load the model (the message is the engine's own)."""


class _Dead(Exception):
    """Queued to every stream when the engine process fails."""


class EngineLink:
    """One front end's pipe to the engine process. `EngineLink(conn)` waits for the engine's
    `Ready` (what the front end needs of the loaded model: `info`)."""

    def __init__(self, conn: Connection, start_timeout: float | None = None):
        self._conn = conn
        self._send_lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._replies: dict[int, concurrent.futures.Future[Any]] = {}
        self._query_ids = itertools.count()
        self._dead: str | None = None
        self._closing = False
        self.on_source: SourceCallback | None = None
        self.on_told: Callable[[Any], None] | None = None
        self.on_ask: Callable[[object], Any] | None = None
        self.on_dead: Callable[[str], None] | None = None
        self.info = self._await_ready(start_timeout)
        self._reader = threading.Thread(target=self._read, name="kvserve-engine-reader", daemon=True)
        self._reader.start()

    # -- the engine client interface ----------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncIterator[EngineOutput]:
        """Stream one request's outputs; the engine's validation errors (PromptTooLongError, bad
        token ids or images) raise at the first iteration, as `AsyncEngineClient`'s do."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        recipe = _recipe(constraint)
        outputs: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        finished = False
        try:
            add = ipc.AddRequest(
                request_id, list(prompt_token_ids), params, recipe, checkpoint_hint, tuple(images)
            )
            # Images' pixels are megabytes (SmolVLM: 51 MB for 17 tiles, ~40 ms to pickle): pickled on
            # a worker thread, so the event loop keeps streaming the others meanwhile.
            self._send_bytes(await asyncio.to_thread(ipc.dumps, add) if images else ipc.dumps(add))
            while not finished:
                output = merge_queued(await outputs.get(), outputs, _checked)
                finished = output.finished
                yield output
        finally:
            if self._streams.pop(request_id, None) is not None and not finished:
                self.abort(request_id)  # consumer went away (disconnect, cancel, break)

    def abort(self, request_id: str) -> None:
        if self._dead is None:
            try:
                self._send(ipc.AbortRequest(request_id))
            except OSError:  # the engine process is gone; the reader fails every stream
                pass

    def shutdown(self, timeout: float = 120.0) -> None:
        """Close this front end's pipe (the engine aborts what it still runs for it)."""
        self._closing = True
        self._conn.close()

    @property
    def is_running(self) -> bool:
        return self._dead is None

    @property
    def num_front_ends(self) -> int:
        return self.info.num_front_ends

    def query(self, query: object, timeout: float = 60.0) -> Any:
        """Ask the engine process (`answer(core, query)` there); blocks the calling thread."""
        return self._ask(lambda query_id: ipc.Query(query_id, query), timeout)

    def gather(self, question: object, timeout: float = 60.0) -> list[Any]:
        """Every other front end's `on_ask(question)` (None from one that did not answer in
        time); blocks the calling thread. [] when this is the only front end."""
        if self.info.num_front_ends == 1:
            return []
        return self._ask(lambda query_id: ipc.Gather(query_id, question), timeout)

    def tell(self, message: Any) -> None:
        """`message` to every other front end's `on_told` (state they replicate)."""
        if self.info.num_front_ends > 1 and self._dead is None:
            try:
                self._send(ipc.Tell(message))
            except OSError:
                pass

    # -- plumbing -------------------------------------------------------------------------

    def _ask(self, make_message: Callable[[int], ipc.Query | ipc.Gather], timeout: float) -> Any:
        """Send `make_message(query_id)` and wait for its `Reply`."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        query_id = next(self._query_ids)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._replies[query_id] = future
        try:
            self._send(make_message(query_id))
            return future.result(timeout)
        finally:
            self._replies.pop(query_id, None)

    def _send(self, message: ipc.ToEngine) -> None:
        self._send_bytes(ipc.dumps(message))

    def _send_bytes(self, data: bytes) -> None:
        with self._send_lock:
            self._conn.send_bytes(data)

    def _is_starting(self) -> bool:
        """While waiting for `Ready`: False once it cannot come any more."""
        return True

    def _await_ready(self, timeout: float | None) -> ipc.EngineInfo:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if not self._is_starting():
                raise EngineStartError(self._start_failure())
            if timeout is not None and waited >= timeout:
                raise EngineStartError(f"the engine did not start in {timeout:.0f} s")
        try:
            message = ipc.loads(self._conn.recv_bytes())
        except EOFError:
            raise EngineStartError(self._start_failure()) from None
        match message:
            case ipc.Ready(info=info):
                return info
            case ipc.StartFailed(message=why):
                raise EngineStartError(why)
            case _:
                raise EngineStartError(f"the engine process sent {type(message).__name__} before Ready")

    def _start_failure(self) -> str:
        return "the engine process closed the pipe"

    def _read(self) -> None:
        """The reader thread: one wake-up of each event loop per engine step, as the in-process
        engine thread does."""
        streams = self._streams
        conn = self._conn
        while True:
            try:
                messages = [ipc.loads(conn.recv_bytes())]
                while conn.poll(0):  # all that waits, for one wake-up of each loop
                    messages.append(ipc.loads(conn.recv_bytes()))
            except (EOFError, OSError, TypeError):  # TypeError: shutdown() closed the pipe under us
                self._fail("the engine process exited")
                return
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
            for message in messages:
                if isinstance(message, list):  # ipc.StepOutputs
                    for item in message:
                        stream = streams.get(item[0])
                        if stream is not None:
                            by_loop.setdefault(stream[0], []).append((stream, ipc.decode_output(item)))
                    continue
                try:
                    if not self._handle(message):
                        return
                except ipc.UnknownMessageError as error:  # an engine this front end cannot understand
                    self._fail(str(error))
                    return
            for loop, items in by_loop.items():
                self._wake(loop, items)

    def _handle(self, message: object) -> bool:
        """A message other than outputs; False once the engine is dead."""
        match message:
            case ipc.RequestFailed(request_id=request_id, error=error):
                stream = self._streams.get(request_id)
                if stream is not None:
                    self._wake(stream[0], [(stream, error)])
            case ipc.Reply(query_id=query_id, value=value, error=error):
                future = self._replies.get(query_id)
                if future is not None:
                    future.set_result(value) if error is None else future.set_exception(error)
            case ipc.PromptSourceFound():
                if self.on_source is not None:
                    self.on_source(
                        message.request_id,
                        message.num_ram_tokens,
                        message.num_disk_tokens,
                        message.checkpoint_id,
                    )
            case ipc.Tell():
                if self.on_told is not None:
                    self.on_told(message.payload)
            case ipc.Ask():
                threading.Thread(target=self._answer_peer, args=(message,), daemon=True).start()
            case ipc.EngineDied(message=why):
                self._fail(why)
                return False
            case _:
                raise ipc.UnknownMessageError(message)
        return True

    def _answer_peer(self, ask: ipc.Ask) -> None:
        value = None
        try:
            if self.on_ask is not None:
                value = self.on_ask(ask.question)
        except Exception:  # the asking front end gets None from this one
            logger.exception("answering %r for another front end", ask.question)
        try:
            self._send(ipc.PeerAnswer(ask.ask_id, value))
        except OSError:
            pass

    def _wake(self, loop: asyncio.AbstractEventLoop, items: list[tuple[_Stream, Any]]) -> None:
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the consumer's loop closed: nobody is listening any more
            for (_, _), item in items:
                if isinstance(item, EngineOutput) and not item.finished:
                    self.abort(item.request_id)

    def _fail(self, why: str) -> None:
        first = self._dead is None
        if first:
            self._dead = why
            if not self._closing:
                logger.error("engine process failed: %s", why)
        for loop, outputs in list(self._streams.values()):
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, _Dead(why))
            except RuntimeError:
                pass
        for future in list(self._replies.values()):
            if not future.done():
                future.set_exception(EngineDeadError(why))
        if first and not self._closing and self.on_dead is not None:
            self.on_dead(why)


class ProcessEngineClient(EngineLink):
    """Starts the engine process (one pipe per front end: this one's, then `peer_conns`)."""

    def __init__(
        self,
        build: Callable[[], EngineCore],
        answer: Answer | None = None,
        *,
        start_timeout: float | None = None,
        num_front_ends: int = 1,
    ):
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
        pipes = [context.Pipe(duplex=True) for _ in range(num_front_ends)]
        level = logging.getLogger().getEffectiveLevel()
        children = [child for _, child in pipes]
        self._process = context.Process(
            target=engine_main, args=(build, answer, children, level), name="kvserve-engine"
        )
        self._process.start()
        for child in children:
            child.close()
        self.peer_conns: list[Connection] = [mine for mine, _ in pipes[1:]]
        try:
            super().__init__(pipes[0][0], start_timeout)
        except EngineStartError:
            self._process.terminate()
            self._process.join(10)
            raise

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the engine process; it saves to the disk tier first (EngineCore.shutdown)."""
        self._closing = True
        if self._process.is_alive():
            try:
                self._send(ipc.Shutdown())
            except OSError:
                pass
            self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("engine process still busy after %.0f s; terminating it", timeout)
            self._process.terminate()
            self._process.join(10)
        self._conn.close()
        for conn in self.peer_conns:
            conn.close()

    @property
    def is_running(self) -> bool:
        return self._dead is None and self._process.is_alive()

    def _is_starting(self) -> bool:
        return self._process.is_alive()

    def _start_failure(self) -> str:
        self._process.join(10)
        return f"the engine process exited with {self._process.exitcode}"


def _recipe(constraint: TokenConstraint | None) -> Any:
    if constraint is None:
        return None
    recipe = getattr(constraint, "recipe", None)
    if recipe is None:
        raise ValueError("this token constraint cannot be sent to the engine process (no recipe)")
    return recipe


def _checked(item: EngineOutput | BaseException) -> EngineOutput:
    if isinstance(item, _Dead):
        raise EngineDeadError(str(item))
    if isinstance(item, BaseException):
        raise item
    return item


def _deliver(items: list[tuple[_Stream, Any]]) -> None:
    for (_, outputs), item in items:
        outputs.put_nowait(item)
