"""The engine process: one `EngineCore` behind one pipe per API front end (`process_client.py`).

Several front ends (`kvserve serve --api-servers N`) share the engine, as vLLM's API servers share
its EngineCore. Each pipe is a `Link` with its own reader and sender threads; the main thread steps
the engine. A request belongs to the front end that added it: its outputs, errors and prompt source
go back on that link only, and when a front end goes away its requests are aborted. Link 0 is the
server's own (the parent process): when it closes the engine shuts down, whatever the others do.

Between front ends the engine is also the hub: a `Tell` goes on to every other front end (state
they replicate), a `Gather` asks each of them and is answered with the list of their answers
(whole-server /metrics). The messages are `ipc.py`'s.
"""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import logging
import os
import pickle
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvserve.engine import ipc
from kvserve.engine.outputs import EngineOutput, merge_outputs
from kvserve.models.vision.image_prompt import image_prompt_spec

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from kvserve.engine.constraint import TokenConstraint
    from kvserve.engine.core import EngineCore

logger = logging.getLogger(__name__)

Answer = Callable[["EngineCore", Any], Any]  # (core, a typed query) -> its answer
GATHER_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class _LinkClosed:
    """On the inbox: the link's front end went away, so its requests have nobody to stream to."""


_Inbound = ipc.AddRequest | ipc.AbortRequest | ipc.Shutdown | _LinkClosed


def engine_main(
    build: Callable[[], EngineCore], answer: Answer | None, conns: list[Connection], level: int
) -> None:
    logging.basicConfig(
        level=level, format=f"%(asctime)s %(levelname)s %(name)s [engine {os.getpid()}]: %(message)s"
    )
    try:
        core = build()
    except SystemExit as error:  # build_engine's one-line errors
        conns[0].send_bytes(ipc.dumps(ipc.StartFailed(str(error.code))))
        return
    except BaseException as error:
        logger.exception("the engine failed to start")
        conns[0].send_bytes(ipc.dumps(ipc.StartFailed(f"the engine failed to start: {error}")))
        return
    # The model, tokenizer and start-up objects live as long as the process: out of the collector's
    # sight, a full collection no longer walks them while steps allocate thousands of outputs a
    # second (as vLLM's engine core does after its start-up).
    gc.collect()
    gc.freeze()
    EngineProcess(core, answer, conns).run()


class Link:
    """One front end's pipe: a send lock, and an outbox its sender thread ships.

    The engine never waits for a front end: a step's outputs go into the outbox and the step loop
    goes on. When the front end reads slower than the engine steps (the pipe is full), the steps
    that pile up leave as one message with each request's tokens merged, so the front end's cost
    follows the number of streams, not of steps, and it catches up."""

    def __init__(self, index: int, conn: Connection):
        self.index = index
        self.conn = conn
        self.send_lock = threading.Lock()
        self.is_open = True
        self.outbox: list[list[EngineOutput]] = []
        self.outbox_ready = threading.Condition()
        self.closing = False
        self.sender = threading.Thread(target=self.ship, name=f"kvserve-engine-send-{index}", daemon=True)

    def send(self, message: ipc.FromEngine) -> None:
        data = ipc.dumps(message)
        with self.send_lock:
            self.conn.send_bytes(data)

    def post(self, outputs: list[EngineOutput]) -> None:
        with self.outbox_ready:
            self.outbox.append(outputs)
            self.outbox_ready.notify()

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
                self.send(ipc.encode_outputs(coalesce(steps)))
            except OSError:  # the front end is gone
                return

    def flush(self) -> None:
        with self.outbox_ready:
            self.closing = True
            self.outbox_ready.notify()
        if self.sender.is_alive():
            self.sender.join(30)


class EngineProcess:
    """The child's threads: the main one steps the engine; each link's sender ships its outputs and
    its reader applies its front end's messages (adds and aborts go to the main thread through a
    queue, queries and gathers are answered on threads of their own)."""

    def __init__(self, core: EngineCore, answer: Answer | None, conns: list[Connection]):
        self.core = core
        self.answer = answer
        self.links = [Link(i, conn) for i, conn in enumerate(conns)]
        self.inbox: queue.SimpleQueue[tuple[int, _Inbound]] = queue.SimpleQueue()  # (link index, message)
        self.owners: dict[str, int] = {}  # request id -> the index of the link that added it
        self.constraints: Any = None  # grammar.compiler.RecipeBuilder, built at the first recipe
        self.gathers: dict[int, concurrent.futures.Future[Any]] = {}  # ask id -> a front end's answer
        self.ask_ids = itertools.count()
        disk = core.disk_tier
        if disk is not None:
            disk.on_source = self.send_source
        tokenizer = core.loaded.tokenizer
        info = ipc.EngineInfo(
            tokenizer,
            core.max_model_len,
            core.loaded.arch.vocab_size,
            None if disk is None else str(disk.store.directory),
            len(conns),
            image_prompt_spec(core.loaded.arch.vision, core.loaded.path, core.loaded.image_processor),
        )
        for link in self.links:
            # `Ready` first on every link; a front end not yet reading its pipe blocks only its own thread.
            link.send_lock.acquire()
            threading.Thread(target=self.serve_link, args=(link, info), daemon=True).start()
            link.sender.start()

    def run(self) -> None:
        core = self.core
        try:
            while self.apply_inbox(block=not core.has_unfinished_requests()):
                if core.has_unfinished_requests():
                    outputs = core.step()
                    if outputs:
                        self.route(outputs)
            core.shutdown()  # on the engine thread: it owns the KV pool being saved
            self.flush()
        except BaseException as error:
            logger.exception("engine process failed")
            self.flush()
            for link in self.links:
                try:
                    link.send(ipc.EngineDied(f"{type(error).__name__}: {error}"))
                except OSError:
                    pass

    def route(self, outputs: list[EngineOutput]) -> None:
        """One step's outputs to the links of their front ends (on the engine thread, which owns
        `owners`)."""
        owners = self.owners
        if len(self.links) == 1:
            for output in outputs:
                if output.finished:
                    owners.pop(output.request_id, None)
            self.links[0].post(outputs)
            return
        by_link: dict[int, list[EngineOutput]] = {}
        for output in outputs:
            index = owners.pop(output.request_id) if output.finished else owners.get(output.request_id)
            if index is not None:
                by_link.setdefault(index, []).append(output)
        for index, mine in by_link.items():
            self.links[index].post(mine)

    def flush(self) -> None:
        for link in self.links:
            link.flush()

    def apply_inbox(self, block: bool) -> bool:
        """Apply queued messages; wait for one when idle. False once shut down."""
        while True:
            try:
                index, message = self.inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            match message:
                case ipc.Shutdown():
                    return False
                case ipc.AddRequest():
                    self.add(index, message)
                case ipc.AbortRequest(request_id=request_id):
                    if request_id in self.owners:
                        self.core.abort_request(request_id)
                case _LinkClosed():
                    for request_id, owner in list(self.owners.items()):
                        if owner == index:
                            self.core.abort_request(request_id)
                case _:
                    raise ipc.UnknownMessageError(message)

    def add(self, index: int, message: ipc.AddRequest) -> None:
        request_id = message.request_id
        try:
            if request_id in self.owners:
                raise ValueError(f"request id {request_id!r} is already running")
            recipe = message.recipe
            constraint = None if recipe is None else self.build_constraint(recipe)
            request = self.core.make_request(
                request_id,
                message.prompt_token_ids,
                message.params,
                constraint,
                message.checkpoint_hint,
                message.images,
            )
            self.core.add_request(request)
        except Exception as error:  # noqa: BLE001 (a bad request fails alone, never the engine)
            self.send_to(index, ipc.RequestFailed(request_id, _picklable(error)))
            return
        self.owners[request_id] = index

    def build_constraint(self, recipe: Any) -> TokenConstraint:
        if self.constraints is None:
            from kvserve.grammar.compiler import RecipeBuilder

            tokenizer = self.core.loaded.tokenizer
            self.constraints = RecipeBuilder(
                tokenizer.tokenizer, self.core.loaded.arch.vocab_size, tokenizer.eos_token_ids
            )
        return self.constraints.build(recipe)

    def send_to(self, index: int, message: ipc.FromEngine) -> None:
        link = self.links[index]
        if link.is_open:
            try:
                link.send(message)
            except OSError:
                pass

    def send_source(
        self, request_id: str, num_ram_tokens: int, num_disk_tokens: int, checkpoint_id: str | None
    ) -> None:
        index = self.owners.get(request_id)
        if index is not None:
            source = ipc.PromptSourceFound(request_id, num_ram_tokens, num_disk_tokens, checkpoint_id)
            self.send_to(index, source)

    # -- the links' reader threads ----------------------------------------------------------

    def serve_link(self, link: Link, info: ipc.EngineInfo) -> None:
        try:
            link.conn.send_bytes(ipc.dumps(ipc.Ready(info)))
        except OSError:
            link.is_open = False
        finally:
            link.send_lock.release()
        while link.is_open:
            try:
                message = ipc.loads(link.conn.recv_bytes())
            except (EOFError, OSError):  # the front end is gone
                break
            try:
                if not self.dispatch(link, message):
                    return
            except ipc.UnknownMessageError:  # a front end this engine cannot understand
                logger.exception("API front end %d: closing its pipe", link.index)
                break
        link.is_open = False
        self.inbox.put((link.index, ipc.Shutdown() if link.index == 0 else _LinkClosed()))
        if link.index:
            logger.warning("API front end %d went away; its requests are aborted", link.index)
        for future in list(self.gathers.values()):  # nobody answers from there any more
            if not future.done() and getattr(future, "link", None) == link.index:
                future.set_result(None)

    def dispatch(self, link: Link, message: object) -> bool:
        """One front-end message; False after a shutdown."""
        match message:
            case ipc.AddRequest() | ipc.AbortRequest():
                self.inbox.put((link.index, message))
            case ipc.Query():
                threading.Thread(target=self.reply, args=(link, message), daemon=True).start()
            case ipc.Tell():
                for other in self.links:
                    if other is not link:
                        self.send_to(other.index, message)
            case ipc.Gather():
                threading.Thread(target=self.gather, args=(link, message), daemon=True).start()
            case ipc.PeerAnswer(ask_id=ask_id, value=value):
                future = self.gathers.get(ask_id)
                if future is not None and not future.done():
                    future.set_result(value)
            case ipc.Shutdown():
                self.inbox.put((link.index, message))
                return False
            case _:
                raise ipc.UnknownMessageError(message)
        return True

    def reply(self, link: Link, message: ipc.Query) -> None:
        query_id, query = message.query_id, message.query
        try:
            if self.answer is None:
                raise LookupError(f"no query {type(query).__name__} in this engine process")
            reply = ipc.Reply(query_id, self.answer(self.core, query))
        except Exception as error:  # noqa: BLE001 (re-raised in the front end's caller)
            reply = ipc.Reply(query_id, error=_picklable(error))
        try:
            self.send_to(link.index, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            failure = RuntimeError(f"query {type(query).__name__}: {error}")
            self.send_to(link.index, ipc.Reply(query_id, error=failure))

    def gather(self, link: Link, message: ipc.Gather) -> None:
        """Ask every other open front end; reply with their answers (None from one that did not
        answer in time)."""
        asked: dict[int, concurrent.futures.Future[Any]] = {}
        for other in self.links:
            if other is link or not other.is_open:
                continue
            ask_id = next(self.ask_ids)
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.link = other.index  # type: ignore[attr-defined]
            self.gathers[ask_id] = asked[ask_id] = future
            self.send_to(other.index, ipc.Ask(ask_id, message.question))
        answers = []
        for ask_id, future in asked.items():
            try:
                answers.append(future.result(GATHER_TIMEOUT_S))
            except concurrent.futures.TimeoutError:
                answers.append(None)
            self.gathers.pop(ask_id, None)
        self.send_to(link.index, ipc.Reply(message.query_id, answers))


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
