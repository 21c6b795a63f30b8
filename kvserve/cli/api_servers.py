"""`kvserve serve --api-servers N`: N API front-end processes over the one engine process. `serve.py`
starts them (`FrontEnds`, `front_end_main`, beside the app each one builds); this module holds how
many there are, the socket they share and the state they share.

vLLM's `--api-server-count`. One front end's event loop (HTTP, rendering,
detokenization, SSE) is one core; on a GPU that serves hundreds of streams it is the bound. The
server's own process is front end 0: it starts the engine process with one pipe per front end,
binds the port, and starts front ends 1..N-1, each a process that gets its pipe and binds the same
port with SO_REUSEPORT: the kernel spreads new connections evenly over the front ends' sockets (one
socket shared by all would go to whichever loop wakes first, and asyncio accepts up to 100
connections in one wake-up: a burst of clients would land on one front end). Each front end owns
the requests it accepted: their engine outputs come back on its pipe only.

What must not depend on which front end a request lands on is shared: the engine state (cache
views, engine gauges, the disk tier) is asked of the engine process; /metrics sums every front
end's request metrics (`EngineLink.gather`); what a front end remembers for the next turn of a
conversation (exact tool-call text, live sequences) is replicated to the others (`tell`). Only
front end 0 persists the tool-call memory file, and its request recorder is the web console's: the
others forward their finished requests to it and ask it the console's questions. A front end that dies has its requests aborted and
the others go on; when front end 0 (the server) exits, the engine and every front end exit too.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from kvserve.api.errors import ApiError
from kvserve.api.front_end_questions import (
    ConsoleHitRate,
    ConsoleQuestion,
    ConsoleRequest,
    ConsoleRequests,
    LiveRequests,
    MetricsSnapshot,
    PrimaryAnswer,
    Question,
)
from kvserve.engine.client import EngineDeadError
from kvserve.engine.engine_process import GATHER_TIMEOUT_S

if TYPE_CHECKING:
    from fastapi import FastAPI

    from kvserve.config import EngineConfig
    from kvserve.engine.process_client import EngineLink
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.request_recorder import RequestRecord
    from kvserve.serving.shared_state import SharedState

logger = logging.getLogger(__name__)

# On the H200 (16 cores, Llama-3.2-1B shape) 2 front ends cut the median TTFT at 64-256 streams and
# 4 added nothing more: past one front end the engine process is the bound (docs/benchmarks/history.md).
MAX_AUTO = 2


def api_server_count(flag: str, separate_process: bool, config: EngineConfig) -> int:
    """`--api-servers auto`: 1 without the engine process (CPU, tensor parallelism: the engine
    shares the server's process); with it, one front end per 4 cores, at most `MAX_AUTO`."""
    if flag != "auto":
        count = int(flag)
        if count < 1:
            raise SystemExit("kvserve: --api-servers must be >= 1")
        if count > 1 and not separate_process:
            raise SystemExit(
                "kvserve: --api-servers > 1 needs the engine in its own process (--engine-process on)"
            )
        return count
    if not separate_process:
        return 1
    return max(1, min(MAX_AUTO, (os.cpu_count() or 1) // 4))


def bind(host: str, port: int) -> socket.socket:
    """A front end's listening socket on the server's port (port 0: a free one, which the others
    then bind too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise SystemExit(f"kvserve: cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    return sock


def wire_front_end(app: FastAPI, link: EngineLink, index: int) -> None:
    """What makes front end `index` one of several (module docstring): the state it shares, the
    peers its /metrics sums, the web console it answers (front end 0's)."""
    service = app.state.chat_service
    service.share = link.tell  # the next turn of a conversation may land on another front end
    link.on_told = functools.partial(_told, service, index)
    link.on_ask = functools.partial(_answer, app, index)
    app.state.metrics.peers = functools.partial(_gather, link, MetricsSnapshot())
    console = app.state.console
    if index == 0:
        peer_live = functools.partial(_gather_live, link)
        app.state.console = dataclasses.replace(console, peer_live=peer_live)
    else:
        service.recorder.forward = lambda record: link.tell(ForwardedRecord(record))
        app.state.console = dataclasses.replace(console, ask_primary=functools.partial(_ask_primary, link))


@dataclasses.dataclass(frozen=True, slots=True)
class ForwardedRecord:
    """A finished request of a front end other than 0, for the console's recorder (front end 0's)."""

    record: RequestRecord


def _told(service: ChatService, index: int, message: SharedState | ForwardedRecord) -> None:
    match message:
        case ForwardedRecord(record):
            if index == 0:
                service.recorder.adopt(record)
        case _:
            service.apply_shared(message)


def _answer(app: FastAPI, index: int, question: object) -> Any:
    """What this front end tells another one that asks (`EngineLink.on_ask`)."""
    from kvserve.api.console.routes import request_model, requests_response

    console = app.state.console
    match question:
        case MetricsSnapshot():
            return app.state.metrics.snapshot()
        case LiveRequests():
            return console.recorder.live()
        case ConsoleRequests() | ConsoleRequest() | ConsoleHitRate() if index != 0:
            return None  # the console's questions are front end 0's to answer
        case ConsoleRequests(after, limit):
            return PrimaryAnswer(requests_response(console, after, limit).model_dump())
        case ConsoleRequest(request_id):
            found = request_model(console, request_id)
            return PrimaryAnswer(None if found is None else found.model_dump())
        case ConsoleHitRate():
            return PrimaryAnswer(console.recorder.hit_rate_series())
        case _:
            raise LookupError(f"unknown front-end question {question!r}")


def _gather(link: EngineLink, question: Question) -> list[Any]:
    """The other front ends' answers (none, logged, when they cannot be had: the caller still
    answers with its own)."""
    try:
        return link.gather(question, timeout=GATHER_TIMEOUT_S + 5)
    except (concurrent.futures.TimeoutError, EngineDeadError) as error:
        logger.warning("the other API front ends did not answer %r (%r)", question, error)
        return []


def _gather_live(link: EngineLink) -> list[Any]:
    return [r for answer in _gather(link, LiveRequests()) if answer is not None for r in answer]


def _ask_primary(link: EngineLink, question: ConsoleQuestion) -> Any:
    for answer in _gather(link, question):
        if isinstance(answer, PrimaryAnswer):
            return answer.value
    raise ApiError(503, "the API front end that keeps the console's records did not answer")
