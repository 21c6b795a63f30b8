"""ProcessEngineClient: the engine core in its own process, the API front end in this one.

vLLM's and SGLang's split (issue 21). In one process the engine thread and the event loop share
one GIL, and on a fast GPU the loop's per-stream socket work stretches every decode step. Here
the engine process only schedules, runs the model and ships each step's token ids; the front
end (this process: HTTP, rendering, detokenization, SSE) talks to it through typed messages over
a pipe (`ipc.py`). It has `AsyncEngineClient`'s interface, so `ChatService` cannot tell them apart.

- `build` (picklable, e.g. a `functools.partial` of a module-level function) builds the
  `EngineCore` in the child; `answer(core, name, args)` (picklable) answers `query()` there, on a
  thread of its own, as the HTTP threads read the in-process engine (web console, metrics).
- A token constraint crosses as its recipe (`constraint.recipe`, `grammar.constraint`), rebuilt
  against the engine's tokenizer in the child.
- The disk tier's per-request prompt source comes back as an event (`on_source`).
- The child ends when the pipe closes (the front end exited) or on `shutdown()`, after the
  engine's own shutdown (the disk tier's shutdown saves).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from kvserve.engine import ipc
from kvserve.engine.client import EngineDeadError, merge_queued
from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.outputs import EngineOutput, merge_outputs
from kvserve.engine.request import CheckpointHint
from kvserve.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from kvserve.engine.core import EngineCore

logger = logging.getLogger(__name__)

Answer = Callable[["EngineCore", str, tuple[Any, ...]], Any]
SourceCallback = Callable[[str, int, int, "str | None"], None]
_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[EngineOutput | BaseException]"]


class EngineStartError(RuntimeError):
    """The engine process could not load the model (the message is the engine's own)."""


class _Dead(Exception):
    """Queued to every stream when the engine process fails."""


class ProcessEngineClient:
    def __init__(
        self,
        build: Callable[[], EngineCore],
        answer: Answer | None = None,
        *,
        start_timeout: float | None = None,
    ):
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
        self._conn, child = context.Pipe(duplex=True)
        level = logging.getLogger().getEffectiveLevel()
        self._process = context.Process(
            target=_engine_main, args=(build, answer, child, level), name="kvserve-engine"
        )
        self._process.start()
        child.close()
        self._send_lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._replies: dict[int, concurrent.futures.Future[Any]] = {}
        self._query_ids = itertools.count()
        self._dead: str | None = None
        self._closing = False
        self.on_source: SourceCallback | None = None
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
    ) -> AsyncIterator[EngineOutput]:
        """Stream one request's outputs; the engine's validation errors (PromptTooLongError, bad
        token ids) raise at the first iteration, as `AsyncEngineClient`'s do."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        recipe = _recipe(constraint)
        outputs: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        finished = False
        try:
            self._send(("add", request_id, list(prompt_token_ids), params, recipe, checkpoint_hint))
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
                self._send(("abort", request_id))
            except OSError:  # the engine process is gone; the reader fails every stream
                pass

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the engine process; it saves to the disk tier first (EngineCore.shutdown)."""
        self._closing = True
        if self._process.is_alive():
            try:
                self._send(("shutdown",))
            except OSError:
                pass
            self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("engine process still busy after %.0f s; terminating it", timeout)
            self._process.terminate()
            self._process.join(10)
        self._conn.close()

    @property
    def is_running(self) -> bool:
        return self._dead is None and self._process.is_alive()

    def query(self, name: str, *args: Any, timeout: float = 60.0) -> Any:
        """Ask the engine process (`answer(core, name, args)` there); blocks the calling thread."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        query_id = next(self._query_ids)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._replies[query_id] = future
        try:
            self._send(("query", query_id, name, args))
            return future.result(timeout)
        finally:
            self._replies.pop(query_id, None)

    # -- plumbing -------------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> None:
        data = ipc.dumps(message)
        with self._send_lock:
            self._conn.send_bytes(data)

    def _await_ready(self, timeout: float | None) -> ipc.EngineInfo:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if not self._process.is_alive():
                raise EngineStartError(f"the engine process exited with {self._process.exitcode}")
            if timeout is not None and waited >= timeout:
                self._process.terminate()
                raise EngineStartError(f"the engine did not start in {timeout:.0f} s")
        try:
            message = ipc.loads(self._conn.recv_bytes())
        except EOFError:
            self._process.join(10)
            raise EngineStartError(f"the engine process exited with {self._process.exitcode}") from None
        if message[0] != "ready":
            self._process.join(10)
            raise EngineStartError(message[1])
        return message[1]

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
            except (EOFError, OSError):
                self._fail("the engine process exited")
                return
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
            for message in messages:
                if message[0] == "out":
                    for item in message[1]:
                        stream = streams.get(item[0])
                        if stream is not None:
                            by_loop.setdefault(stream[0], []).append((stream, ipc.decode_output(item)))
                elif not self._handle(message):
                    return
            for loop, items in by_loop.items():
                self._wake(loop, items)

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """A message other than outputs; False once the engine is dead."""
        kind = message[0]
        if kind == "error":
            stream = self._streams.get(message[1])
            if stream is not None:
                self._wake(stream[0], [(stream, message[2])])
        elif kind == "reply":
            future = self._replies.get(message[1])
            if future is not None:
                ok, value = message[2], message[3]
                future.set_result(value) if ok else future.set_exception(value)
        elif kind == "source":
            if self.on_source is not None:
                self.on_source(*message[1:])
        elif kind == "dead":
            self._fail(message[1])
            return False
        return True

    def _wake(self, loop: asyncio.AbstractEventLoop, items: list[tuple[_Stream, Any]]) -> None:
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the consumer's loop closed: nobody is listening any more
            for (_, _), item in items:
                if isinstance(item, EngineOutput) and not item.finished:
                    self.abort(item.request_id)

    def _fail(self, why: str) -> None:
        if self._dead is None:
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


# -- the engine process -------------------------------------------------------------------


def _engine_main(
    build: Callable[[], EngineCore], answer: Answer | None, conn: Connection, level: int
) -> None:
    logging.basicConfig(
        level=level, format=f"%(asctime)s %(levelname)s %(name)s [engine {os.getpid()}]: %(message)s"
    )
    try:
        core = build()
    except SystemExit as error:  # build_engine's one-line errors
        conn.send_bytes(ipc.dumps(("fatal", str(error.code))))
        return
    except BaseException as error:
        logger.exception("the engine failed to start")
        conn.send_bytes(ipc.dumps(("fatal", f"the engine failed to start: {error}")))
        return
    _EngineProcess(core, answer, conn).run()


class _EngineProcess:
    """The child's threads: the main one steps the engine; a sender ships its outputs; a reader
    applies the front end's messages (adds and aborts go to the main thread through a queue,
    queries are answered on threads of their own).

    The engine never waits for the front end: a step's outputs go into the outbox and the step
    loop goes on. When the front end reads slower than the engine steps (the pipe is full), the
    steps that pile up in the outbox leave as one message with each request's tokens merged,
    so the front end's cost follows the number of streams, not of steps, and it catches up."""

    def __init__(self, core: EngineCore, answer: Answer | None, conn: Connection):
        self.core = core
        self.answer = answer
        self.conn = conn
        self.send_lock = threading.Lock()
        self.inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.live: set[str] = set()
        self.constraints: Any = None  # grammar.compiler.RecipeBuilder, built at the first recipe
        disk = core.disk_tier
        if disk is not None:
            disk.on_source = lambda *source: self.send(("source", *source))
        tokenizer = core.loaded.tokenizer
        info = ipc.EngineInfo(
            tokenizer,
            core.max_model_len,
            core.loaded.arch.vocab_size,
            None if disk is None else str(disk.store.directory),
        )
        self.outbox: list[list[EngineOutput]] = []
        self.outbox_ready = threading.Condition()
        self.closing = False
        self.send(("ready", info))
        threading.Thread(target=self.read, name="kvserve-engine-inbox", daemon=True).start()
        self.sender = threading.Thread(target=self.ship, name="kvserve-engine-sender", daemon=True)
        self.sender.start()

    def send(self, message: tuple[Any, ...]) -> None:
        data = ipc.dumps(message)
        with self.send_lock:
            self.conn.send_bytes(data)

    def run(self) -> None:
        core = self.core
        try:
            while self.apply_inbox(block=not core.has_unfinished_requests()):
                if core.has_unfinished_requests():
                    outputs = core.step()
                    if outputs:
                        for output in outputs:
                            if output.finished:
                                self.live.discard(output.request_id)
                        with self.outbox_ready:
                            self.outbox.append(outputs)
                            self.outbox_ready.notify()
            core.shutdown()  # on the engine thread: it owns the KV pool being saved
            self.flush()
        except BaseException as error:
            logger.exception("engine process failed")
            try:
                self.flush()
                self.send(("dead", f"{type(error).__name__}: {error}"))
            except OSError:
                pass

    def ship(self) -> None:
        """The sender thread: whatever steps are waiting, as one message (blocks in the pipe's
        write with the GIL released)."""
        while True:
            with self.outbox_ready:
                while not self.outbox and not self.closing:
                    self.outbox_ready.wait()
                steps, self.outbox = self.outbox, []
                if not steps:
                    return
            try:
                self.send(("out", ipc.encode_outputs(coalesce(steps))))
            except OSError:  # the front end is gone
                return

    def flush(self) -> None:
        with self.outbox_ready:
            self.closing = True
            self.outbox_ready.notify()
        self.sender.join(30)

    def apply_inbox(self, block: bool) -> bool:
        """Apply queued messages; wait for one when idle. False once shut down."""
        while True:
            try:
                message = self.inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            kind = message[0]
            if kind == "shutdown":
                return False
            if kind == "add":
                self.add(*message[1:])
            elif message[1] in self.live:
                self.core.abort_request(message[1])

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        recipe: Any,
        checkpoint_hint: CheckpointHint | None,
    ) -> None:
        try:
            constraint = None if recipe is None else self.build_constraint(recipe)
            request = self.core.make_request(
                request_id, prompt_token_ids, params, constraint, checkpoint_hint
            )
            self.core.add_request(request)
        except Exception as error:  # noqa: BLE001 (a bad request fails alone, never the engine)
            self.send(("error", request_id, _picklable(error)))
            return
        self.live.add(request_id)

    def build_constraint(self, recipe: Any) -> TokenConstraint:
        if self.constraints is None:
            from kvserve.grammar.compiler import RecipeBuilder

            tokenizer = self.core.loaded.tokenizer
            self.constraints = RecipeBuilder(
                tokenizer.tokenizer, self.core.loaded.arch.vocab_size, tokenizer.eos_token_ids
            )
        return self.constraints.build(recipe)

    def read(self) -> None:
        while True:
            try:
                message = ipc.loads(self.conn.recv_bytes())
            except (EOFError, OSError):  # the front end is gone
                self.inbox.put(("shutdown",))
                return
            if message[0] == "query":
                threading.Thread(target=self.reply, args=message[1:], daemon=True).start()
            else:
                self.inbox.put(message)
                if message[0] == "shutdown":
                    return

    def reply(self, query_id: int, name: str, args: tuple[Any, ...]) -> None:
        try:
            if self.answer is None:
                raise LookupError(f"no query {name!r} in this engine process")
            result: tuple[bool, Any] = (True, self.answer(self.core, name, args))
        except Exception as error:  # noqa: BLE001 (re-raised in the front end's caller)
            result = (False, _picklable(error))
        try:
            self.send(("reply", query_id, *result))
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            self.send(("reply", query_id, False, RuntimeError(f"query {name!r}: {error}")))


def coalesce(steps: list[list[EngineOutput]]) -> list[EngineOutput]:
    """Consecutive steps' outputs as one step's: each request's outputs merged, in first-seen order."""
    if len(steps) == 1:
        return steps[0]
    by_request: dict[str, list[EngineOutput]] = {}
    for outputs in steps:
        for output in outputs:
            by_request.setdefault(output.request_id, []).append(output)
    return [merge_outputs(group) for group in by_request.values()]


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (any unpicklable error crosses as its text)
        kind = ValueError if isinstance(error, ValueError) else RuntimeError
        return kind(f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}")
