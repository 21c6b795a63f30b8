"""The typed objects that cross the scheduler -> runner -> scheduler -> client boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvserve.engine.request import FinishReason, Logprob, Request


@dataclass(slots=True)
class ScheduledRequest:
    """One sequence's share of a step: compute `num_new_tokens` tokens starting at
    `request.num_computed_tokens`, whose KV goes into `block_ids` (the full block table)."""

    request: Request
    num_new_tokens: int
    block_ids: list[int]

    @property
    def start(self) -> int:
        return self.request.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        return self.request.num_output_tokens > 0 and self.num_new_tokens == 1

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the known tokens, so a token is sampled."""
        return self.start + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    """The one batch plan per step; decodes come first, then prefill chunks."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    aborted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class RunnerOutput:
    """Sampled token (and logprobs when asked) for each scheduled request that samples."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, Logprob] = field(default_factory=dict)


@dataclass(slots=True)
class EngineOutput:
    """What a client sees after a step: new tokens of one request, and its end if it ended.

    Treated as immutable (`merge_outputs` builds a new one), but not declared frozen: a frozen
    dataclass's __init__ sets each field through object.__setattr__, ~1.9 µs against ~0.3 µs here,
    and one is built per request per step in the engine and again in each API front end (at 256
    streams, ~100K a second)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_logprobs: tuple[Logprob, ...] = ()
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0  # prompt tokens prefilled so far; set on prefill-progress outputs
    error: str | None = None  # with FinishReason.ERROR: why the token constraint failed
    num_cache_write_tokens: int = 0  # tokens of this request sent to disk checkpoints so far

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def merge_outputs(outputs: list[EngineOutput]) -> EngineOutput:
    """Consecutive outputs of one request as one: tokens and logprobs in order, the last one's
    counters and finish. A consumer that fell behind the engine catches up in one wake-up, one
    detokenizer call and one SSE frame instead of one per step."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    return replace(
        last,
        new_token_ids=tuple(t for o in outputs for t in o.new_token_ids),
        new_logprobs=tuple(lp for o in outputs for lp in o.new_logprobs),
        num_cache_write_tokens=max(o.num_cache_write_tokens for o in outputs),
    )
