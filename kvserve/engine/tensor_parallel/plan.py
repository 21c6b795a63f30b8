"""What rank 0 sends the other ranks each step, and how they rebuild the batch from it.

Rank 0's scheduler owns the requests; a worker keeps a shadow `Request` per running sequence
(prompt, output tokens, block table) so that it can hand its `ModelRunner` the very same
`ScheduledRequest` list and run the very same forward. Each step ships only deltas (vLLM's
new/cached request split): a sequence's prompt once, then the output tokens sampled since and
the blocks appended since; a block table that changed otherwise (preemption) is sent whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SequenceStep:
    request_id: str
    start: int  # num_computed_tokens on rank 0
    num_new_tokens: int
    num_kept_blocks: int  # of the block table the worker has; the rest is `new_block_ids`
    new_block_ids: list[int]
    new_output_ids: list[int]  # output tokens sampled since the last plan that named it
    prompt_token_ids: list[int] | None = None  # the first time only
    uses_trained_rope: bool = False  # its RoPE regime (engine/rope_regime.py), which may change once


@dataclass(frozen=True)
class StepPlan:
    steps: list[SequenceStep]
    released_ids: list[str] = field(default_factory=list)  # finished since the last plan: forget them


class PlanEncoder:
    """Rank 0: turns each step's ScheduledRequests into a StepPlan of deltas."""

    def __init__(self) -> None:
        self._num_outputs: dict[str, int] = {}
        self._blocks: dict[str, list[int]] = {}
        self._released: list[str] = []

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._blocks.pop(request_id, None) is not None:
                del self._num_outputs[request_id]
                self._released.append(request_id)

    def encode(self, scheduled: list[ScheduledRequest]) -> StepPlan:
        steps = [self._step(s) for s in scheduled]
        released, self._released = self._released, []
        return StepPlan(steps, released)

    def _step(self, s: ScheduledRequest) -> SequenceStep:
        request = s.request
        request_id, outputs = request.request_id, request.output_token_ids
        is_new = request_id not in self._blocks
        sent_outputs = self._num_outputs.get(request_id, 0)
        sent_blocks = self._blocks.get(request_id, [])
        kept = len(sent_blocks) if s.block_ids[: len(sent_blocks)] == sent_blocks else 0
        self._num_outputs[request_id] = len(outputs)
        self._blocks[request_id] = list(s.block_ids)
        return SequenceStep(
            request_id=request_id,
            start=s.start,
            num_new_tokens=s.num_new_tokens,
            num_kept_blocks=kept,
            new_block_ids=s.block_ids[kept:],
            new_output_ids=outputs[sent_outputs:],
            prompt_token_ids=list(request.prompt_token_ids) if is_new else None,
            uses_trained_rope=request.uses_trained_rope,
        )


class PlanDecoder:
    """Worker ranks: StepPlans -> the ScheduledRequests rank 0's runner sees."""

    _PARAMS = SamplingParams()  # workers never sample

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}
        self._blocks: dict[str, list[int]] = {}

    @property
    def num_sequences(self) -> int:
        return len(self._requests)

    def decode(self, plan: StepPlan) -> list[ScheduledRequest]:
        for request_id in plan.released_ids:
            self._requests.pop(request_id, None)
            self._blocks.pop(request_id, None)
        return [self._scheduled(step) for step in plan.steps]

    def _scheduled(self, step: SequenceStep) -> ScheduledRequest:
        if step.prompt_token_ids is not None:
            self._requests[step.request_id] = Request(step.request_id, step.prompt_token_ids, self._PARAMS)
            self._blocks[step.request_id] = []
        request = self._requests[step.request_id]
        request.output_token_ids.extend(step.new_output_ids)
        request.num_computed_tokens = step.start
        request.uses_trained_rope = step.uses_trained_rope
        blocks = self._blocks[step.request_id]
        del blocks[step.num_kept_blocks :]
        blocks.extend(step.new_block_ids)
        return ScheduledRequest(request, step.num_new_tokens, list(blocks))
