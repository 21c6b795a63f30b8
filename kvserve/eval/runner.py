"""The runner: sends cases to the server in parallel, grades each answer, retries incomplete ones.

It runs on one asyncio loop; the UI reads `runs` (plain attribute reads) and steers it with
`pause`, `resume`, `enqueue` and `stop` through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvserve.eval.client import ChatSettings, EvalClient, RequestFailed
from kvserve.eval.eval_case import EvalCase
from kvserve.eval.grade import CaseStatus, Grade, ModelOutput, grade
from kvserve.eval.prompts import messages_for
from kvserve.eval.result import CaseResult
from kvserve.eval.sandbox import SandboxLimits

logger = logging.getLogger(__name__)
# Tokens the chat template adds around each message (role markers), on top of the text itself.
_TEMPLATE_TOKENS_PER_MESSAGE = 8
_CONTEXT_MARGIN = 16
_ERROR_BACKOFF_S = 1.0


@dataclass(frozen=True)
class RunSettings:
    chat: ChatSettings = field(default_factory=ChatSettings)
    parallel: int = 4
    retries: int = 1  # extra attempts for an ERROR or INCOMPLETE case (an incomplete one gets 2x tokens)
    max_tokens: int | None = None  # overrides every case's own budget
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)


@dataclass
class CaseRun:
    """One case's live state, read by the UI while the run goes on."""

    case: EvalCase
    result: CaseResult = field(init=False)
    text: str = ""  # the output streamed so far

    def __post_init__(self) -> None:
        self.result = CaseResult(self.case, CaseStatus.PENDING)

    @property
    def status(self) -> CaseStatus:
        return self.result.status


class EvalRunner:
    def __init__(
        self,
        client: EvalClient,
        cases: list[EvalCase],
        settings: RunSettings,
        on_finish: Callable[[CaseResult], None] = lambda _: None,
    ):
        self.client = client
        self.settings = settings
        self.runs = [CaseRun(case) for case in cases]
        self.model = ""
        self.context_length: int | None = None
        self.is_paused = False
        self.on_finish = on_finish
        self._queue: asyncio.PriorityQueue[tuple[int, int, int]] = asyncio.PriorityQueue()
        self._order = itertools.count()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._workers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        info = await self.client.server_info()
        self.model, self.context_length = info.model, info.context_length
        for index in range(len(self.runs)):
            self._queue.put_nowait((1, next(self._order), index))
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.parallel)]

    async def wait_all(self) -> None:
        await self._queue.join()

    async def run(self) -> list[CaseResult]:
        """Runs every case once and returns their results (the plain, non-interactive path)."""
        await self.start()
        try:
            await self.wait_all()
        finally:
            await self.stop()
        return self.results()

    def results(self) -> list[CaseResult]:
        return [run.result for run in self.runs]

    def pause(self) -> None:
        """No new case starts until `resume`; cases already running finish."""
        self.is_paused = True
        self._resumed.clear()

    def resume(self) -> None:
        self.is_paused = False
        self._resumed.set()

    def enqueue(self, index: int) -> None:
        """Runs one case (again) ahead of the queue."""
        if self.runs[index].status is not CaseStatus.RUNNING:
            self.runs[index].result = CaseResult(self.runs[index].case, CaseStatus.PENDING)
            self._queue.put_nowait((0, next(self._order), index))

    async def stop(self) -> None:
        """Cancels the workers; a case cut off mid-answer ends STOPPED."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def _work(self) -> None:
        while True:
            _, _, index = await self._queue.get()
            try:
                await self._resumed.wait()
                await self._run_case(self.runs[index])
            except asyncio.CancelledError:
                run = self.runs[index]
                if run.status is CaseStatus.RUNNING:
                    partial = ModelOutput(
                        run.text, finish_reason="stopped"
                    )  # kept in the trace, never graded
                    run.result = CaseResult(
                        run.case, CaseStatus.STOPPED, detail="the run was stopped", output=partial
                    )
                    self.on_finish(run.result)
                raise
            finally:
                self._queue.task_done()

    async def _run_case(self, run: CaseRun) -> None:
        case, start = run.case, time.monotonic()
        budget = self.settings.max_tokens or case.max_tokens
        run.result = CaseResult(case, CaseStatus.RUNNING)
        result = run.result
        for attempt in range(1, self.settings.retries + 2):
            run.text = ""
            result = await self._attempt(run, budget)
            result = replace(result, attempts=attempt, elapsed_s=time.monotonic() - start)
            if (
                result.status not in (CaseStatus.ERROR, CaseStatus.INCOMPLETE)
                or attempt > self.settings.retries
            ):
                break
            if result.status is CaseStatus.INCOMPLETE:
                budget *= 2
            else:
                await asyncio.sleep(_ERROR_BACKOFF_S * attempt)  # give a struggling server a moment
            logger.info("%s: %s (%s), retrying", case.id, result.status.value, result.detail)
        run.result = result
        self.on_finish(result)

    async def _attempt(self, run: CaseRun, budget: int) -> CaseResult:
        case = run.case
        messages = messages_for(case)
        max_tokens = await self._clamp(case, messages, budget)
        if max_tokens < 1:
            return CaseResult(case, CaseStatus.INCOMPLETE, detail="the prompt fills the context")

        def on_text(text: str) -> None:
            run.text += text

        try:
            output, usage = await self.client.chat(
                self.model, messages, max_tokens, self.settings.chat, list(case.tools) or None, on_text
            )
        except RequestFailed as error:
            return CaseResult(case, CaseStatus.ERROR, detail=str(error), max_tokens=max_tokens)
        graded: Grade = await asyncio.to_thread(grade, case, output, self.settings.sandbox)
        return CaseResult(
            case, CaseStatus.RUNNING, output=output, max_tokens=max_tokens, usage=usage
        ).with_grade(graded)

    async def _clamp(self, case: EvalCase, messages: list[dict[str, str]], budget: int) -> int:
        """The budget, cut to what is left of the context after the prompt (a longer request would be
        refused by a strict server, and would waste a retry)."""
        if self.context_length is None:
            return budget
        text = "\n".join(m["content"] for m in messages) + (
            json.dumps(list(case.tools)) if case.tools else ""
        )
        try:
            count = await self.client.count_tokens(text)
        except RequestFailed:
            count = None
        num_prompt = count if count is not None else len(text) // 3  # ~3 characters a token, erring high
        num_prompt += _TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
        return min(budget, self.context_length - num_prompt - _CONTEXT_MARGIN)
