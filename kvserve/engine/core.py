"""EngineCore: the step loop (schedule -> execute -> update) over one model and one KV pool."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvserve.config import EngineConfig, resolve, resolve_weight_quant
from kvserve.engine.cache_key import cache_key
from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.disk_tier import DiskTier
from kvserve.engine.disk_tier_open import open_kv_tier
from kvserve.engine.image_input import ImageInput, check_images
from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.kv_pool import build_runner, resolve_kv_pool
from kvserve.engine.kv_tier import OpenKVTier
from kvserve.engine.outputs import EngineOutput, RunnerOutput, SchedulerOutput
from kvserve.engine.overlap import PendingStep, can_overlap
from kvserve.engine.request import CheckpointHint, Request
from kvserve.engine.rope_regime import OnDemandRope
from kvserve.engine.runner.encoder_cache import EncoderCache
from kvserve.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import RequestTooLongError, Scheduler
from kvserve.models.loaded import LoadedModel
from kvserve.models.vision.interface import ImageInputModel

if TYPE_CHECKING:
    from kvserve.engine.tensor_parallel.driver import TPDriver

logger = logging.getLogger(__name__)

# The prompt does not fit the context (or the KV pool); the API maps it to context_length_exceeded.
PromptTooLongError = RequestTooLongError


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel,
        tp: TPDriver | None = None,
        open_tier: OpenKVTier = open_kv_tier,
    ):
        """`tp`: at tensor-parallel size > 1, rank 0's driver of the other ranks (tensor_parallel/launch.py
        builds it and `loaded` holds rank 0's shard); the engine then runs its runner through it.
        `open_tier` opens the KV tier below RAM, which the engine then binds to its pool: by default
        the disk tier `config.kv_store` names, else none (NullKVTier)."""
        config = resolve_weight_quant(resolve(config), loaded.file_weight_quant)
        self.config = config
        self.loaded = loaded
        self.device = torch.device(config.device)
        self.tp = tp
        self.max_model_len, self.num_blocks = resolve_kv_pool(config, loaded)
        if tp is not None:
            self.num_blocks = tp.group.min_int(self.num_blocks)  # every rank's pool holds as many blocks
        block_size = config.cache.block_size
        self.cache_key = cache_key(config, loaded.fingerprint)
        self.kv_manager = KVCacheManager(block_size, self.num_blocks, extra_key=self.cache_key)
        model = loaded.model
        # The model that takes images, where it does (and rank 0 can encode them alone: not under TP).
        self.image_model = model if isinstance(model, ImageInputModel) and tp is None else None
        self.scheduler = Scheduler(
            max_num_seqs=config.scheduler.max_num_seqs,
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
            budget_with_decodes=config.scheduler.budget_with_decodes,
            kv_manager=self.kv_manager,
            max_model_len=self.max_model_len,
            keep_images_whole=self.image_model is not None and self.image_model.image_spans_bidirectional,
            rope=OnDemandRope.of(loaded.arch),
        )
        runner = build_runner(config, loaded, self.num_blocks, self.max_model_len)
        self.encoder_cache: EncoderCache | None = None if runner.images is None else runner.images.cache
        self.runner: ModelRunner | TPDriver = runner if tp is None else tp.attach(runner)
        overlap = config.async_scheduling
        if overlap is None:
            overlap = runner.graphs is not None
        self.async_scheduling = overlap and tp is None
        self._pending: PendingStep | None = None  # the launched step whose tokens are not read yet
        self.kv_tier = open_tier(config, loaded, self.cache_key)
        self.kv_tier.bind(self.kv_manager, self.runner)
        self.kv_block_bytes = kv_bytes_per_block(loaded, block_size, config.torch_kv_dtype)
        logger.info(
            "engine ready: ctx %d, %d KV blocks of %d tokens (%.0f MiB), dtype %s, device %s",
            self.max_model_len,
            self.num_blocks,
            block_size,
            self.num_blocks * self.kv_block_bytes / 2**20,
            config.dtype
            if config.cache.kv_dtype == config.dtype
            else f"{config.dtype} (KV {config.cache.kv_dtype})",
            config.device,
        )

    @property
    def disk_tier(self) -> DiskTier | None:
        """The KV tier when it is the disk tier: its store, stats and text lookup serve the API and
        the console."""
        tier = self.kv_tier
        return tier if isinstance(tier, DiskTier) else None

    def make_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
        images: Sequence[ImageInput] = (),
    ) -> Request:
        """`images`: in prompt order, each over its placeholder tokens (ImageInput); ValueError when
        the model takes none or they do not fit the prompt."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        vocab_size = self.loaded.arch.vocab_size
        if any(t >= vocab_size for t, _ in params.logit_bias) or not all(
            0 <= t < vocab_size for t in prompt_token_ids
        ):
            raise ValueError(f"token ids must be in [0, {vocab_size})")
        if images:
            if self.image_model is None:
                raise ValueError("this engine takes no images (a text model, or tensor-parallel ranks)")
            model = self.image_model
            check_images(prompt_token_ids, images, model.image_token_id, model.count_image_rows)
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            eos_token_ids=self.loaded.tokenizer.eos_token_ids,
            arrival_time=time.monotonic(),
            max_model_len=self.max_model_len,
            constraint=constraint,
            checkpoint_hint=checkpoint_hint,
            images=tuple(images),
        )
        # Checked here, on the caller's thread, so the error reaches it before queueing.
        limit = self.scheduler.token_limit(request)
        if len(prompt_token_ids) >= limit:
            raise PromptTooLongError(f"prompt has {len(prompt_token_ids)} tokens; the context is {limit}")
        return request

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineOutput]:
        if self.async_scheduling:
            if can_overlap(self.scheduler, self.kv_manager.num_free_blocks) and self.runner.can_launch_greedy(
                self.scheduler.num_running
            ):
                return self._overlapped_step()
            if self._pending is not None:  # read it first; the next step() runs the usual way
                return self._read_pending()
        tier = self.kv_tier
        if tier.can_load:  # a plain attribute: NullKVTier costs no per-request calls here
            self._load_from_tier()
        scheduler_output = self.scheduler.schedule()
        tier.save_evicted()  # before the forward overwrites blocks handed out by schedule()
        runner_output = (
            self.runner.execute(scheduler_output) if scheduler_output.scheduled else RunnerOutput()
        )
        outputs = self.scheduler.update(scheduler_output, runner_output)
        outputs = tier.save(scheduler_output, outputs)
        self._release_finished(outputs)
        return outputs + _prefill_progress(scheduler_output, outputs)

    def _load_from_tier(self) -> None:
        """The tier's KV of the requests about to be admitted (the head of the queue), into cached
        pool blocks where the scheduler's prefix lookup finds it."""
        num_slots = max(0, self.scheduler.max_num_seqs - self.scheduler.num_running)
        for request in itertools.islice(self.scheduler.waiting, num_slots):
            if self.kv_tier.lookup(request):
                self.kv_tier.load(request)

    def _release_finished(self, outputs: list[EngineOutput]) -> None:
        finished_ids = [o.request_id for o in outputs if o.finished]
        self.runner.release(finished_ids)
        self.kv_tier.request_finished(finished_ids)

    def _overlapped_step(self) -> list[EngineOutput]:
        """Plan and launch the next decode step, then read the pending one (see overlap.py)."""
        pending = self._pending
        scheduler_output = self.scheduler.schedule()
        scheduled = scheduler_output.scheduled
        # can_overlap() ruled out admissions, aborts and preemption: the plan is the running decodes.
        assert not scheduler_output.preempted_ids and all(s.num_new_tokens == 1 for s in scheduled)
        self.kv_tier.save_evicted()
        if pending is None:
            tokens = self.runner.launch_greedy(scheduled)
            outputs = []
        else:
            assert len(scheduled) == len(pending.scheduled)
            assert all(s.request is p.request for s, p in zip(scheduled, pending.scheduled, strict=True))
            tokens = self.runner.launch_greedy(scheduled, pending.tokens, pending.rows)
            outputs = self._resolve(pending)  # the device is busy with the step just launched
        live = [row for row, s in enumerate(scheduled) if not s.request.is_finished]
        live_scheduled = [scheduled[row] for row in live]
        self.scheduler.update_pending(live_scheduled)
        self._pending = PendingStep(live_scheduled, tokens, live) if live else None
        return outputs

    def _read_pending(self) -> list[EngineOutput]:
        pending, self._pending = self._pending, None
        assert pending is not None
        return self._resolve(pending)

    def _resolve(self, pending: PendingStep) -> list[EngineOutput]:
        step_ids = pending.tokens.wait()
        token_ids = [step_ids[row] for row in pending.rows]
        outputs = self.scheduler.resolve_pending(pending.requests, token_ids)
        outputs = self.kv_tier.save(pending.scheduler_output, outputs)
        self._release_finished(outputs)
        return outputs

    def shutdown(self) -> None:
        """Clean exit: save what is worth keeping to the KV tier and wait for the writes."""
        if self._pending is not None:  # its tokens complete the requests the saves below copy
            self._read_pending()
        self.kv_tier.shutdown(self.scheduler.running)
        if self.tp is not None:  # after the shutdown saves, which copy KV out of every rank
            self.tp.shutdown()

    def generate(self, requests: list[Request]) -> dict[str, list[EngineOutput]]:
        """Run `requests` to completion (offline use: CLI, benchmarks, tests)."""
        results: dict[str, list[EngineOutput]] = {r.request_id: [] for r in requests}
        for request in requests:
            self.add_request(request)
        while self.has_unfinished_requests():
            for output in self.step():
                results[output.request_id].append(output)
        return results


def _prefill_progress(scheduler_output: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
    """A token-less output for each request whose prompt is still prefilling in chunks, so
    callers can report progress (and send keepalives) during a long prefill."""
    reported = {o.request_id for o in outputs}
    return [
        EngineOutput(
            request_id=s.request.request_id,
            new_token_ids=(),
            num_prompt_tokens=s.request.num_prompt_tokens,
            num_cached_tokens=max(s.request.num_cached_tokens, 0),
            num_computed_tokens=s.request.num_computed_tokens,
        )
        for s in scheduler_output.scheduled
        if s.request.request_id not in reported
        and not s.request.is_finished
        and not s.request.output_token_ids
    ]
