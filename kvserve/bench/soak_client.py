"""One soak client: conversations over one API after another until the run's end, some turns cut
off on purpose (before the first byte, during prefill, mid-stream), some of those retried with the
same body, tool-call turns followed by their result and Responses turns chained by
`previous_response_id`. Every request gets a deadline; one that passes it is a hung request.

The choices are drawn from a seeded `random.Random` (`plan_conversation`, `plan_cut`: pure), so a run
is repeatable up to the server's timing.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from dataclasses import dataclass

import httpx

from kvserve.bench.soak_wire import SoakApi, StreamReader, Turn, TurnRequest, request_body


class CutPoint(enum.Enum):
    BEFORE_FIRST_BYTE = "before_first_byte"
    MID_PREFILL = "mid_prefill"
    MID_STREAM = "mid_stream"


class Outcome(enum.Enum):
    OK = "ok"
    CUT = "cut"  # the client disconnected on purpose
    HTTP_4XX = "http_4xx"
    # The server's 409 by design: tool results for a call it made whose live sequence it no longer
    # holds (evicted, or a restart), sent without the call; the client replays the history, as told.
    CONFLICT = "conflict"
    HTTP_5XX = "http_5xx"
    HUNG = "hung"  # no complete answer before the deadline
    FAILED = "failed"  # a transport error or an incomplete stream the client did not cause


@dataclass(frozen=True)
class SoakMix:
    disconnect_share: float = 0.25  # of requests, cut at a random point
    retry_share: float = 0.5  # of cut requests, sent again with the same body
    tool_share: float = 0.3  # of conversations, opening with a forced tool call
    max_turns: int = 4
    max_tokens: int = 32
    min_prompt_words: int = 50
    max_prompt_words: int = 1200  # the first turn's user text: long enough to be cut mid-prefill
    deadline_s: float = 300.0


@dataclass(frozen=True)
class ConversationPlan:
    api: SoakApi
    num_turns: int
    opens_with_tool: bool
    prompt_words: int


@dataclass(frozen=True)
class CutPlan:
    point: CutPoint
    after_s: float  # BEFORE_FIRST_BYTE / MID_PREFILL: cut this long after sending
    after_events: int  # MID_STREAM: cut after this many content events


@dataclass(frozen=True)
class RequestRecord:
    client_id: int
    api: SoakApi
    # "first", "tool_call", "tool_result", "chained", "followup"; "+retry" when resent after a cut,
    # "+replay" when resent with the whole history after a conflict
    kind: str
    started_s: float  # since the run began
    duration_s: float
    outcome: Outcome
    status: int | None
    ttft_s: float | None = None
    cut: CutPoint | None = None  # what was planned
    cut_stage: str | None = None  # where it landed: "no_response", "prefill", "stream"
    error: str | None = None


# The message of kvserve's only 409 (serving/tool_continuation.py), in Responses' and Anthropic's words.
CONTINUATION_GONE = "continuation state is not available; retry by replaying the full"


def classify_status(status: int, error_body: str | None) -> Outcome:
    """A non-200 answer: the continuation-gone 409 is an expected conflict (the protocol's way to ask
    for the full history); any other 4xx, a 409 included, is a failure of the run, as a 5xx is."""
    if status >= 500:
        return Outcome.HTTP_5XX
    if status == 409 and CONTINUATION_GONE in (error_body or ""):
        return Outcome.CONFLICT
    return Outcome.HTTP_4XX


def plan_conversation(rng: random.Random, api: SoakApi, mix: SoakMix) -> ConversationPlan:
    opens_with_tool = rng.random() < mix.tool_share
    num_turns = rng.randint(2 if opens_with_tool else 1, mix.max_turns)
    return ConversationPlan(
        api, num_turns, opens_with_tool, rng.randint(mix.min_prompt_words, mix.max_prompt_words)
    )


def plan_cut(rng: random.Random, mix: SoakMix) -> CutPlan | None:
    if rng.random() >= mix.disconnect_share:
        return None
    point = rng.choice(list(CutPoint))
    after_s = rng.uniform(0.0, 0.05) if point is CutPoint.BEFORE_FIRST_BYTE else rng.uniform(0.05, 2.0)
    return CutPlan(point, after_s, rng.randint(1, max(1, mix.max_tokens // 2)))


_WORDS = [
    "agent",
    "buffer",
    "cache",
    "commit",
    "deploy",
    "engine",
    "function",
    "graph",
    "handler",
    "index",
    "journal",
    "kernel",
    "lambda",
    "module",
    "network",
    "object",
    "parser",
    "query",
    "request",
    "schema",
    "thread",
    "update",
    "vector",
    "worker",
    "yield",
    "zone",
    "batch",
    "branch",
    "client",
    "config",
    "daemon",
    "error",
    "filter",
    "socket",
    "stream",
    "token",
    "value",
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


class SoakClient:
    def __init__(
        self,
        client_id: int,
        http: httpx.AsyncClient,
        base_url: str,
        model: str,
        system: str,
        mix: SoakMix,
        began: float,
        seed: int,
    ) -> None:
        self.client_id, self.http, self.base_url, self.model = client_id, http, base_url.rstrip("/"), model
        self.system, self.mix, self.began = system, mix, began
        self.rng = random.Random(seed * 1_000_003 + client_id)
        self.records: list[RequestRecord] = []

    async def run(self, stop_at: float) -> list[RequestRecord]:
        apis = list(SoakApi)
        n = self.client_id
        while time.monotonic() < stop_at:
            api = apis[n % len(apis)]  # every client goes through the three APIs in turn
            n += 1
            await self._conversation(plan_conversation(self.rng, api, self.mix), stop_at)
        return self.records

    async def _conversation(self, plan: ConversationPlan, stop_at: float) -> None:
        history: list[Turn] = []
        first_text = f"[{self.client_id}:{len(self.records)}] " + words(self.rng, plan.prompt_words)
        for index in range(plan.num_turns):
            if time.monotonic() >= stop_at:
                return
            if index == 0:
                request = TurnRequest(
                    first_text, force_tool=plan.opens_with_tool, max_tokens=self.mix.max_tokens
                )
                kind = "tool_call" if plan.opens_with_tool else "first"
            elif history[-1].tool_call is not None:
                request = TurnRequest(tool_result=words(self.rng, 40), max_tokens=self.mix.max_tokens)
                kind = "tool_result"
            else:
                request = TurnRequest(
                    words(self.rng, self.rng.randint(5, 60)), max_tokens=self.mix.max_tokens
                )
                kind = "chained" if plan.api is SoakApi.RESPONSES else "followup"
            turn = await self._turn(plan.api, history, request, kind)
            if turn is None:
                return  # cut and not retried, or failed: the conversation is abandoned
            history.append(turn)

    async def _turn(self, api: SoakApi, history: list[Turn], request: TurnRequest, kind: str) -> Turn | None:
        body = request_body(api, self.system, history, request, self.model)
        cut = plan_cut(self.rng, self.mix)
        turn = await self._send(api, body, request, kind, cut)
        if turn is None and self.records[-1].outcome is Outcome.CONFLICT:
            replay = request_body(api, self.system, history, request, self.model, chain=False)
            return await self._send(api, replay, request, kind + "+replay", None)
        if cut is None or turn is not None or self.rng.random() >= self.mix.retry_share:
            return turn
        return await self._send(api, body, request, kind + "+retry", None)

    async def _send(
        self, api: SoakApi, body: dict, request: TurnRequest, kind: str, cut: CutPlan | None
    ) -> Turn | None:
        start = time.monotonic()
        state = _StreamState(StreamReader(api))
        task = asyncio.create_task(self._stream(api, body, state, cut))
        limit = self.mix.deadline_s
        is_timed_cut = cut is not None and cut.point is not CutPoint.MID_STREAM
        if is_timed_cut:
            limit = min(limit, cut.after_s)
        done, _ = await asyncio.wait({task}, timeout=limit)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            outcome = Outcome.CUT if is_timed_cut else Outcome.HUNG
            return self._record(
                api, kind, start, outcome, state, cut, error=None if is_timed_cut else "deadline"
            )
        error = task.exception()
        if error is not None:
            return self._record(
                api, kind, start, Outcome.FAILED, state, cut, error=f"{type(error).__name__}: {error}"
            )
        return self._finish(api, kind, start, state, cut, request)

    def _finish(
        self,
        api: SoakApi,
        kind: str,
        start: float,
        state: _StreamState,
        cut: CutPlan | None,
        request: TurnRequest,
    ) -> Turn | None:
        reader = state.reader
        if state.status is not None and state.status != 200:
            outcome = classify_status(state.status, state.error_body)
            return self._record(api, kind, start, outcome, state, cut, error=state.error_body)
        if state.was_cut:
            return self._record(api, kind, start, Outcome.CUT, state, cut)
        if reader.error or not reader.is_done:
            error = reader.error or "stream ended before its end marker"
            return self._record(api, kind, start, Outcome.FAILED, state, cut, error=error)
        self._record(api, kind, start, Outcome.OK, state, cut)
        return reader.turn(request)

    async def _stream(self, api: SoakApi, body: dict, state: _StreamState, cut: CutPlan | None) -> None:
        async with self.http.stream("POST", self.base_url + api.path, json=body) as response:
            state.status = response.status_code
            if response.status_code != 200:
                state.error_body = (await response.aread()).decode("utf-8", "replace")[:300]
                return
            event: str | None = None
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    state.reader.feed(event, line[5:].strip())
                    event = None
                    if state.reader.num_content_events and state.first_content_at is None:
                        state.first_content_at = time.monotonic()
                    if _is_cut_now(cut, state.reader.num_content_events):
                        state.was_cut = True
                        return  # leaving the block closes the connection mid-stream

    def _record(
        self,
        api: SoakApi,
        kind: str,
        start: float,
        outcome: Outcome,
        state: _StreamState,
        cut: CutPlan | None,
        error: str | None = None,
    ) -> None:
        ttft = None if state.first_content_at is None else state.first_content_at - start
        if outcome is Outcome.CUT:
            stage = "no_response" if state.status is None else ("prefill" if ttft is None else "stream")
        else:
            stage = None
        self.records.append(
            RequestRecord(
                self.client_id,
                api,
                kind,
                start - self.began,
                time.monotonic() - start,
                outcome,
                state.status,
                ttft_s=ttft if outcome is Outcome.OK else None,
                cut=cut.point if cut else None,
                cut_stage=stage,
                error=error,
            )
        )


def _is_cut_now(cut: CutPlan | None, num_content_events: int) -> bool:
    return cut is not None and cut.point is CutPoint.MID_STREAM and num_content_events >= cut.after_events


@dataclass
class _StreamState:
    reader: StreamReader
    status: int | None = None
    error_body: str | None = None
    first_content_at: float | None = None
    was_cut: bool = False
