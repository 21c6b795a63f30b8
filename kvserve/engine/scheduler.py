"""Scheduler: continuous batching with chunked prefill, FCFS admission and preemption by recompute.

Each step has a token budget. Running requests go first, in arrival order: a decode
takes one token, a request still prefilling takes the next chunk of its prompt, so decodes
keep flowing while a long prompt is prefilled over several steps. Waiting requests are then
admitted first come, first served while the budget, `max_num_seqs` and the KV pool allow.
When a running request needs a block and none is free, the latest arrival is preempted:
its blocks are freed (they stay cached, so the recompute is often a prefix hit) and it
goes back to the front of the queue with its output so far. A chunk may cut an image's span,
unless the model attends both ways inside images (`keep_images_whole`). Under on-demand RoPE
scaling (`rope`, engine/rope_regime.py) admission picks each request's regime, and a trained-regime
request whose answer outgrows the trained context is moved to the scaled regime the same way:
its blocks freed (cached under the trained hashes), its prompt and output so far recomputed.

The engine calls `schedule()`, runs the model, then `update()`, every step (also when
the plan is empty: `update()` is where the final outputs of aborted requests come from).
Overlapped decode steps (engine/overlap.py) replace `update()` by `update_pending()` at launch and
`resolve_pending()` once their tokens are read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvserve.engine.kv_cache.manager import ComputedBlocks, KVCacheManager
from kvserve.engine.outputs import EngineOutput, RunnerOutput, ScheduledRequest, SchedulerOutput
from kvserve.engine.request import Logprob, Request, RequestStatus
from kvserve.engine.rope_regime import OnDemandRope

# Stands for a decode step's token while the step still runs: it keeps num_tokens one ahead of
# num_computed_tokens, so the next schedule() plans the request's next decode as usual.
PENDING_TOKEN = -1


class RequestTooLongError(ValueError):
    """The prompt leaves no room to generate: it reaches the context limit or the whole KV pool."""


@dataclass
class _StepPlan:
    token_budget: int
    decodes: list[ScheduledRequest] = field(default_factory=list)
    prefills: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)

    def add(self, request: Request, num_new_tokens: int, block_ids: list[int]) -> None:
        scheduled = ScheduledRequest(request, num_new_tokens, block_ids)
        (self.decodes if scheduled.is_decode else self.prefills).append(scheduled)
        self.token_budget -= num_new_tokens


class Scheduler:
    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_manager: KVCacheManager,
        max_model_len: int,
        long_prefill_token_threshold: int | None = None,
        keep_images_whole: bool = False,
        rope: OnDemandRope | None = None,
        budget_with_decodes: int | None = None,
    ) -> None:
        """`budget_with_decodes`: the step's token budget while any running sequence has output
        (its stream waits for the whole step); None: max_num_batched_tokens. `keep_images_whole`: the
        model attends both ways inside an image, so no prefill chunk and no prefix hit may end inside
        one (ImageInputModel.image_spans_bidirectional). `rope`: the rule of a model that scales RoPE
        on demand (rope_regime.py); None: one regime."""
        assert max_num_seqs > 0 and max_num_batched_tokens > 0 and max_model_len > 1
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.budget_with_decodes = min(budget_with_decodes or max_num_batched_tokens, max_num_batched_tokens)
        self.kv = kv_manager
        self.max_model_len = max_model_len
        # The pool never changes size: read per sampled token (token_limit), so computed once.
        self._engine_token_limit = min(max_model_len, kv_manager.max_num_tokens)
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.keep_images_whole = keep_images_whole
        self.rope = rope
        self.waiting: deque[Request] = deque()
        # NOTE: in arrival order, since admission is FCFS and the preempted re-enter at the head
        # of the queue; the last one is the latest arrival, preempted first.
        self.running: list[Request] = []
        self._requests: dict[str, Request] = {}  # every unfinished request
        self._abort_ids: dict[str, None] = {}  # an ordered set, applied at the next schedule()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def has_pending_aborts(self) -> bool:
        return bool(self._abort_ids)

    def add_request(self, request: Request) -> None:
        """Queue a request. Raises RequestTooLongError if its prompt can never be served."""
        limit = self.token_limit(request)
        if request.num_prompt_tokens >= limit:
            raise RequestTooLongError(
                f"request {request.request_id}: {request.num_prompt_tokens} prompt tokens, limit {limit}"
            )
        assert request.request_id not in self._requests, f"duplicate request id {request.request_id}"
        if self.rope is not None:  # before anything hashes its blocks: the regime is in their key
            max_tokens = min(request.sampling_params.max_tokens, limit - request.num_prompt_tokens)
            request.uses_trained_rope = self.rope.fits(request.num_prompt_tokens, max_tokens)
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self._requests[request.request_id] = request

    def abort_request(self, request_id: str) -> None:
        """Abort at the next step boundary; unknown or already finished ids are ignored."""
        if request_id in self._requests:
            self._abort_ids[request_id] = None

    def token_limit(self, request: Request) -> int:
        """Most tokens (prompt + output) the request may reach: the context limit, and the
        pool size, so that any request fits alone and preemption can never deadlock."""
        limit = self._engine_token_limit
        own = request.max_model_len
        return limit if own is None or own >= limit else own

    def regime_token_limit(self, request: Request) -> int:
        """Most tokens the request may reach without ending or changing its RoPE regime."""
        limit = self.token_limit(request)
        return limit if self.rope is None else min(limit, self.rope.token_limit(request))

    def schedule(self) -> SchedulerOutput:
        aborted = self._apply_aborts()
        plan = _StepPlan(token_budget=self._step_budget())
        self._schedule_running(plan)
        # A step that had to preempt has no blocks to spare for newcomers.
        if not plan.preempted_ids:
            self._schedule_waiting(plan)
        return SchedulerOutput(
            scheduled=plan.decodes + plan.prefills, preempted_ids=plan.preempted_ids, aborted=aborted
        )

    def _step_budget(self) -> int:
        budget = self.max_num_batched_tokens
        if self.budget_with_decodes < budget and any(request.output_token_ids for request in self.running):
            return self.budget_with_decodes  # a stream is waiting on this step: keep it short
        return budget

    def update(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[EngineOutput]:
        """Apply one step's results; returns the outputs of requests that got a token or ended."""
        outputs = [self._output(request, None, None) for request in scheduler_output.aborted]
        outgrown: list[Request] = []  # trained-RoPE requests whose next token lies past that context
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            samples = scheduled.samples  # read before num_computed_tokens moves
            request.num_computed_tokens += scheduled.num_new_tokens
            self.kv.cache_blocks(request, request.num_computed_tokens)
            if not samples:
                continue
            token_id = runner_output.sampled_token_ids.get(request.request_id)
            # NOTE: without a token the request could never be scheduled again (nothing left to compute).
            assert token_id is not None, f"runner sampled no token for {request.request_id}"
            logprob = runner_output.logprobs.get(request.request_id)
            request.output_token_ids.append(token_id)
            if logprob is not None:
                request.output_logprobs.append(logprob)
            self._check_stop(request, token_id)
            if request.constraint is not None and not request.is_finished:
                _advance_constraint(request, token_id)
            outputs.append(self._output(request, token_id, logprob))
            # A plain attribute first: one-regime engines pay nothing more per token.
            if request.uses_trained_rope and self.rope is not None and self.rope.outgrown(request):
                outgrown.append(request)
        self._release_finished()
        self._extend(outgrown)
        return outputs

    def update_pending(self, scheduled: list[ScheduledRequest]) -> None:
        """Account a launched one-token decode step whose tokens are not known yet: each request's KV
        grows by one token and it gets PENDING_TOKEN as its next output. The caller guarantees that
        no request can end on its length in this step (only a token's value can end it)."""
        kv = self.kv
        block_size = kv.block_size
        for s in scheduled:
            request = s.request
            assert s.num_new_tokens == 1
            request.num_computed_tokens += 1
            # Full blocks up to here hold known tokens only: the pending one is the last token. The
            # blocks before are registered already, so only a step that fills a block has one to add.
            if request.num_computed_tokens % block_size == 0:
                kv.cache_blocks(request, request.num_computed_tokens)
            request.output_token_ids.append(PENDING_TOKEN)

    def resolve_pending(self, requests: list[Request], token_ids: list[int]) -> list[EngineOutput]:
        """The tokens of a step accounted by update_pending: stop checks and outputs, as update() does
        (update_pending's caller ruled out a stop by length)."""
        outputs = []
        any_finished = False
        output = self._output
        for request, token_id in zip(requests, token_ids, strict=True):
            output_ids = request.output_token_ids
            assert output_ids[-1] == PENDING_TOKEN
            output_ids[-1] = token_id
            if _stops_on(request, token_id):
                request.status = RequestStatus.FINISHED_STOPPED
                any_finished = True
            outputs.append(output(request, token_id, None))
        if any_finished:  # else skip a pass over every running request, once per step
            self._release_finished()
        return outputs

    def _schedule_running(self, plan: _StepPlan) -> None:
        # Runs for every running request every step (256 of them on a GPU), hence written out flat:
        # the chunk, the allocation and the plan entry without a method call each.
        kv = self.kv
        threshold = self.long_prefill_token_threshold
        whole_images = self.keep_images_whole
        running = self.running
        decodes, prefills = plan.decodes, plan.prefills
        index = 0
        while index < len(running) and plan.token_budget > 0:
            request = running[index]
            num_output = len(request.output_token_ids)
            num_remaining = len(request.prompt_token_ids) + num_output - request.num_computed_tokens
            num_new_tokens = min(num_remaining, plan.token_budget, threshold or num_remaining)
            if whole_images and request.images:
                num_new_tokens = _whole_images(request, request.num_computed_tokens, num_new_tokens)
            if kv.allocate_slots(request, num_new_tokens) is None and not self._allocate_or_preempt(
                request, num_new_tokens, plan
            ):
                return  # it preempted itself, being the last running request
            scheduled = ScheduledRequest(request, num_new_tokens, kv.block_ids(request.request_id))
            (decodes if num_output and num_new_tokens == 1 else prefills).append(scheduled)
            plan.token_budget -= num_new_tokens
            index += 1

    def _allocate_or_preempt(self, request: Request, num_new_tokens: int, plan: _StepPlan) -> bool:
        """Get blocks for `request`, preempting the latest arrivals until they fit.

        NOTE: victims come from the tail of `running`, which this step has not scheduled
        yet, so no already-planned request is ever taken back."""
        while self.kv.allocate_slots(request, num_new_tokens) is None:
            victim = self.running.pop()
            self._preempt(victim)
            plan.preempted_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        while self.waiting and plan.token_budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hit = self.kv.get_computed_blocks(request)
            whole_images = self.keep_images_whole and request.images
            if whole_images:
                hit = _hit_before_images(request, hit, self.kv.block_size)
            num_new_tokens = self._chunk(request.num_tokens - hit.num_computed_tokens, plan)
            if whole_images:
                num_new_tokens = _whole_images(request, hit.num_computed_tokens, num_new_tokens)
            if self.kv.allocate_slots(request, num_new_tokens, hit.blocks) is None:
                return  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            request.num_computed_tokens = hit.num_computed_tokens
            if request.num_cached_tokens < 0:  # reported for the first admission only
                request.num_cached_tokens = hit.num_computed_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.add(request, num_new_tokens, self.kv.block_ids(request.request_id))

    def _chunk(self, num_remaining: int, plan: _StepPlan) -> int:
        num_tokens = min(num_remaining, plan.token_budget)
        if self.long_prefill_token_threshold:
            num_tokens = min(num_tokens, self.long_prefill_token_threshold)
        return num_tokens

    def _preempt(self, request: Request) -> None:
        # Recompute keeps the output: the re-prefill covers prompt + output so far.
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _extend(self, outgrown: list[Request]) -> None:
        """Move trained-regime requests that outgrew the trained context to the scaled regime: their KV
        is recomputed under it (a prefix hit where the scaled regime has one), their output so far
        kept. Never in an overlapped step: regime_token_limit stops those short of it."""
        for request in outgrown:
            if request.is_finished:  # its last token ended it: nothing more to compute
                continue
            self.running.remove(request)
            self._preempt(request)  # frees the blocks under their trained hashes
            request.uses_trained_rope = False
            request.overlap_limit = None  # computed for the other regime's limit

    def _apply_aborts(self) -> list[Request]:
        aborted = []
        for request_id in self._abort_ids:
            request = self._requests.pop(request_id, None)
            if request is None:  # finished since abort_request() was called
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self.kv.free(request)
            request.status = RequestStatus.FINISHED_ABORTED
            aborted.append(request)
        self._abort_ids.clear()
        return aborted

    def _check_stop(self, request: Request, token_id: int) -> None:
        params = request.sampling_params
        if _stops_on(request, token_id):
            request.status = RequestStatus.FINISHED_STOPPED
        elif request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.token_limit(
            request
        ):
            request.status = RequestStatus.FINISHED_LENGTH

    def _release_finished(self) -> None:
        finished = [request for request in self.running if request.is_finished]
        if not finished:
            return
        self.running = [request for request in self.running if not request.is_finished]
        for request in finished:
            self.kv.free(request)
            del self._requests[request.request_id]

    @staticmethod
    def _output(request: Request, token_id: int | None, logprob: Logprob | None) -> EngineOutput:
        # Positional: built for every request every step (keywords cost a third more).
        return EngineOutput(
            request.request_id,
            () if token_id is None else (token_id,),
            () if logprob is None else (logprob,),
            request.finish_reason,
            len(request.prompt_token_ids),
            max(request.num_cached_tokens, 0),
            0,
            request.error,
        )


def _whole_images(request: Request, start: int, num_new_tokens: int) -> int:
    """The chunk [start, start + num_new_tokens) cut short before an image it would end inside, or,
    starting on the image, grown to hold all of it (past the step's token budget if need be)."""
    end = start + num_new_tokens
    for image in request.images:
        if image.offset < end < image.end:
            return (image.offset if image.offset > start else image.end) - start
    return num_new_tokens


def _hit_before_images(request: Request, hit: ComputedBlocks, block_size: int) -> ComputedBlocks:
    """A prefix hit that ends inside an image, cut back to the block where the image starts."""
    num_hit = hit.num_computed_tokens
    for image in request.images:
        if image.offset < num_hit < image.end:
            num_blocks = image.offset // block_size
            return ComputedBlocks(hit.blocks[:num_blocks], num_blocks * block_size)
    return hit


def _stops_on(request: Request, token_id: int) -> bool:
    """EOS (unless ignored) or one of the request's stop token ids."""
    params = request.sampling_params
    return (token_id in request.eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids


def _advance_constraint(request: Request, token_id: int) -> None:
    """Feed the sampled token to the request's constraint: a rejection fails the request alone; a
    constraint that admits nothing but end-of-sequence ends it here, without sampling that token."""
    constraint = request.constraint
    assert constraint is not None
    if not constraint.accept_token(token_id):
        request.status = RequestStatus.FINISHED_ERROR
        request.error = constraint.error or f"token {token_id} violates the request's constraint"
    elif constraint.is_finished:
        request.status = RequestStatus.FINISHED_STOPPED
