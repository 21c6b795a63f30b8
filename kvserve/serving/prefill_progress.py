"""One request's prefill progress: the counts behind keepalive events, and INFO log lines.

The engine reports each prefill chunk (a token-less output with `num_computed_tokens`). A long
prefill logs its progress every few seconds, and every request logs one line when its first
token arrives. Times run from when the request was handed to the engine, queueing included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvserve.serving.engine_protocol import EngineOutput
from kvserve.serving.events import PrefillProgress

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 2.0
REPORT_INTERVAL_S = 0.25


class PrefillTracker:
    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        reports: bool = False,
    ):
        """`reports`: the client asked for prefill progress (the `kvserve` extension)."""
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.is_done = False
        self.elapsed_s: float | None = None  # time to the first token, once it came
        self.reports = reports
        self._clock = clock
        self._started = self._last_log = clock()
        self._last_report = float("-inf")

    def update(self, output: EngineOutput) -> bool:
        """A progress output: one more prefill chunk is done. True when a progress report is due
        (asked for, and none in the last REPORT_INTERVAL_S: a bar needs no more)."""
        self.num_computed_tokens = output.num_computed_tokens
        self.num_cached_tokens = output.num_cached_tokens
        now = self._clock()
        is_due = self.reports and now - self._last_report >= REPORT_INTERVAL_S
        if is_due:
            self._last_report = now
        self._log(now)
        return is_due

    def _log(self, now: float) -> None:
        if now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            progress = self.progress()
            logger.info(
                "request %s prefill: %d/%d tokens (%d cached), %.0f tok/s",
                self.request_id,
                progress.num_computed_tokens,
                progress.num_prompt_tokens,
                progress.num_cached_tokens,
                progress.tokens_per_s,
            )

    def progress(self) -> PrefillProgress:
        return PrefillProgress(
            self.num_prompt_tokens,
            self.num_computed_tokens,
            self.num_cached_tokens,
            self._clock() - self._started,
            is_detailed=self.reports,
        )

    def finish(self, num_cached_tokens: int) -> None:
        """The first token arrived, so the whole prompt is in the cache."""
        self.is_done = True
        self.num_computed_tokens, self.num_cached_tokens = self.num_prompt_tokens, num_cached_tokens
        progress = self.progress()
        self.elapsed_s = progress.elapsed_s
        logger.info(
            "request %s prefill done: %d tokens (%d cached) in %.2f s, %.0f tok/s",
            self.request_id,
            progress.num_prompt_tokens,
            progress.num_cached_tokens,
            progress.elapsed_s,
            progress.tokens_per_s,
        )
