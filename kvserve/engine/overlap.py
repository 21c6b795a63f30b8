"""Overlapped greedy decode ("async scheduling"): the host plans and launches step n + 1 while the
device still runs step n, and reads step n's tokens only after that.

Why: one stream of a 1B model on an H200 decodes in ~0.95 ms of device time per step, and the host
needs ~0.15 ms per step to read the ids, update the requests, run stop checks and plan the next
step. Run one after the other they add up; overlapped, the device never waits for Python. Step
n + 1's input ids are step n's argmax, copied on the device; its requests carry PENDING_TOKEN
(scheduler.py) until step n's ids are read.

The price: a request that stops on EOS or a stop token in step n has already been given step n + 1,
whose token is dropped. Its KV slot lies past the request's last full block, in a block it frees,
so no cached block ever holds it. A stop by length is known in advance, so the step that ends a
request by length is never overlapped; nor is a step with anything the overlapped path does not
handle (an arrival, an abort, sampling, a grammar, logprobs, penalties, a prefill chunk, a pool too
full to grow every request by a block): the pending step is read first and the engine runs its
usual synchronous step.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.engine.outputs import ScheduledRequest, SchedulerOutput
from kvserve.engine.request import Request
from kvserve.engine.runner.pending_tokens import PendingTokens
from kvserve.engine.sampler import is_plain_greedy
from kvserve.engine.scheduler import Scheduler


@dataclass
class PendingStep:
    """A launched decode step whose tokens the host has not read: `rows[i]` is the row of
    `scheduled[i]` in `tokens` (rows of requests that stopped meanwhile are skipped)."""

    scheduled: list[ScheduledRequest]
    tokens: PendingTokens
    rows: list[int]

    @property
    def scheduler_output(self) -> SchedulerOutput:
        return SchedulerOutput(scheduled=self.scheduled)

    @property
    def requests(self) -> list[Request]:
        return [s.request for s in self.scheduled]


def can_overlap(scheduler: Scheduler, num_free_blocks: int) -> bool:
    """The next step can be launched before the pending one (if any) is read: every running request
    is a plain-greedy one-token decode that cannot end by length in it, nothing waits or aborts,
    and every request can get a new block without preempting anyone.

    Asked before every decode step for every running request (256 of them at a time on a GPU), so
    the per-request test is a few integer compares against a limit computed once per request."""
    running = scheduler.running
    if not running or scheduler.waiting or scheduler.has_pending_aborts:
        return False
    if num_free_blocks < len(running):
        return False
    for request in running:
        limit = request.overlap_limit
        if limit is None:
            limit = request.overlap_limit = overlap_limit(request, scheduler.regime_token_limit(request))
        num_output = len(request.output_token_ids)
        # A one-token decode: everything but the last sampled token is computed.
        if not (
            0 < num_output
            and num_output + 1 < limit
            and request.num_computed_tokens == len(request.prompt_token_ids) + num_output - 1
        ):
            return False
    return True


def overlap_limit(request: Request, token_limit: int) -> int:
    """The request may take part in an overlapped step while its output count n has n + 1 < this
    limit (after the step's token it must still be short of max_tokens and of the context: see
    scheduler._check_stop, and of a RoPE regime switch); 0 for a request that never can (sampling,
    logprobs, a grammar...)."""
    params = request.sampling_params
    if request.constraint is not None or not is_plain_greedy(params):
        return 0
    return min(params.max_tokens, token_limit - len(request.prompt_token_ids))
