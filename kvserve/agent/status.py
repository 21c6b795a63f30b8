"""The status bar's numbers: context used/total, tokens generated, decode and prefill speed, cached
prompt tokens. Pure: fed by the loop's events and a clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvserve.agent.events import PrefillProgress, ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta
from kvserve.agent.messages import Usage


@dataclass
class GenerationStats:
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    first_token: float | None = None
    num_deltas: int = 0  # until the usage arrives, one delta is about one token
    usage: Usage | None = None
    ended: float | None = None
    prefill: PrefillProgress | None = None  # the server's latest prefill counts (kvserve only)

    def start(self) -> None:
        self.started, self.first_token, self.num_deltas, self.usage, self.ended = (
            self.clock(),
            None,
            0,
            None,
            None,
        )
        self.prefill = None

    def add(self, event: StreamEvent) -> None:
        if isinstance(event, PrefillProgress):
            self.prefill = event
        elif isinstance(event, TextDelta | ReasoningDelta | ToolCallDelta):
            if self.first_token is None:
                self.first_token = self.clock()
            self.num_deltas += 1

    def end(self, usage: Usage) -> None:
        """`usage` is empty when the generation was cancelled before the server reported it."""
        self.usage, self.ended = (usage if usage.prompt_tokens else None), self.clock()

    @property
    def num_generated(self) -> int:
        return (
            self.usage.completion_tokens if self.usage and self.usage.completion_tokens else self.num_deltas
        )

    def decode_rate(self) -> float | None:
        if self.first_token is None:
            return None
        # The first token closes the prefill; decode speed counts the ones after it.
        elapsed = (self.ended or self.clock()) - self.first_token
        return (self.num_generated - 1) / elapsed if elapsed > 0.05 and self.num_generated > 1 else None

    def prefill_text(self) -> str:
        if self.first_token is None and self.prefill is not None:
            return prefill_bar(self.prefill)
        if self.first_token is None:
            return f"prefill {self.clock() - self.started:.1f}s"
        seconds = self.first_token - self.started
        if self.usage is None or seconds <= 0:
            return f"prefill {seconds:.1f}s"
        computed = self.usage.prompt_tokens - self.usage.cached_tokens
        return f"prefill {computed} tok @ {computed / seconds:.0f} t/s"


def prefill_bar(progress: PrefillProgress, width: int = 12) -> str:
    """`prefill [#####-------] 42% 1024/2437 @ 310 t/s`: the counts the server reported."""
    filled = round(progress.fraction * width)
    rate = progress.tokens_per_s
    speed = f" @ {rate:.0f} t/s" if rate is not None else ""
    return (
        f"prefill [{'#' * filled}{'-' * (width - filled)}] {progress.fraction:.0%} "
        f"{progress.num_processed_tokens}/{progress.num_prompt_tokens}{speed}"
    )


@dataclass
class StatusBar:
    context_length: int
    stats: GenerationStats = field(default_factory=GenerationStats)
    context_used: int = 0
    cached_tokens: int = 0
    note: str = ""

    def text(self) -> str:
        parts = [
            f"ctx {self.context_used}/{self.context_length}",
            f"generation {self.stats.num_generated} tokens",
        ]
        rate = self.stats.decode_rate()
        parts.append(f"{rate:.1f} t/s" if rate is not None else "– t/s")
        parts.append(f"cached {self.cached_tokens}")
        parts.append(self.stats.prefill_text() if self.stats.started else "idle")
        if self.note:
            parts.append(self.note)
        return " | ".join(parts)
