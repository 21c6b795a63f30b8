"""ModelRunner: owns the KV pool tensors, runs one forward per step and samples on the device."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from kvserve.config import AttentionBackendName
from kvserve.engine.dry import breaker_mask
from kvserve.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from kvserve.engine.request import Logprob, Request
from kvserve.engine.runner.batch import build_model_inputs
from kvserve.engine.runner.device_setup import GRAPH_MEMORY_BYTES, select_attention_backend
from kvserve.engine.runner.encoder_cache import EncoderCache
from kvserve.engine.runner.image_rows import ImageEmbedder
from kvserve.engine.runner.pending_tokens import PendingTokens, PendingTokensBuffers
from kvserve.engine.runner.token_masks import build_token_masks
from kvserve.engine.sampler import Sampler, SamplingBatch, is_plain_greedy, logits_and_greedy, make_generator
from kvserve.models.layers.attention.backend import CapturesDecode
from kvserve.models.layers.attention.metadata import forward_context
from kvserve.models.loaded import LoadedModel
from kvserve.models.vision.interface import ImageInputModel

logger = logging.getLogger(__name__)


def kv_bytes_per_block(loaded: LoadedModel, block_size: int, kv_dtype: torch.dtype) -> int:
    num_layers, num_kv_heads, head_dim = loaded.model.kv_cache_spec()
    element_size = torch.empty((), dtype=kv_dtype).element_size()
    return num_layers * 2 * block_size * num_kv_heads * head_dim * element_size


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zero-filled KV memory. Masked slots are still read by attention, so it must hold finite
    values; on CPU, numpy's calloc gives lazily-zeroed pages, so a multi-GB pool costs nothing
    until used (torch.zeros would touch every page at start-up)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(num_bytes, dtype=np.uint8)).view(dtype).view(shape)


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        *,
        kv_dtype: torch.dtype,  # config.CacheConfig.kv_dtype: the model's, or fp16 under fp32 on CPU
        attention_backend: AttentionBackendName = "auto",
        enforce_eager: bool = False,
        max_num_seqs: int = 1,
        max_model_len: int = 0,
        prefill_attention_dtype: torch.dtype | None = None,
        encoder_cache_bytes: int = 256 * 2**20,
    ):
        self.model = loaded.model
        self.device = device
        self.block_size = block_size
        self.vocab_size = loaded.arch.vocab_size
        backend = select_attention_backend(self.model, device, attention_backend, prefill_attention_dtype)
        self.attention_backend = backend.name
        num_layers, num_kv_heads, head_dim = self.model.kv_cache_spec()
        # [2, num_blocks, block_size, num_kv_heads, head_dim] per layer: K then V.
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches = [_zeros(shape, kv_dtype, device) for _ in range(num_layers)]
        self.model.bind_kv_caches(self.kv_caches)
        self.sampler = Sampler()
        self._tokenizer = loaded.tokenizer.tokenizer
        self._dry_breakers: np.ndarray | None = None  # built at the first DRY row (~0.2 s)
        self._generators: dict[str, torch.Generator | None] = {}
        self._pending_buffers = PendingTokensBuffers(max_num_seqs, device)
        # A model that takes images: its steps with image tokens run on inputs_embeds; None: never.
        self.images = (
            ImageEmbedder(self.model, EncoderCache(encoder_cache_bytes), device)
            if isinstance(self.model, ImageInputModel)
            else None
        )
        # Low-bit decode copies (--weight-quant, CPU) and dense CPU rows: decode rows of a step that also
        # computes prompt tokens run in a forward of their own (see _forward_eager).
        from kvserve.models.layers.quant import DenseRowsLinear, WeightOnlyLinear

        self.split_mixed_steps = any(
            isinstance(m, (WeightOnlyLinear, DenseRowsLinear)) for m in self.model.modules()
        )
        self.graphs = None
        if device.type == "cuda" and not enforce_eager and isinstance(backend, CapturesDecode):
            from kvserve.engine.runner.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(
                self.model,
                backend,
                max_batch_size=max_num_seqs,
                max_blocks_per_seq=-(-max(max_model_len, block_size) // block_size),
                block_size=block_size,
                device=device,
                memory_budget_bytes=GRAPH_MEMORY_BYTES,
            )

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        scheduled = scheduler_output.scheduled
        if self._graphs_can_run(scheduled):
            logits, greedy_ids = self.graphs.run(scheduled)
            if all(
                s.samples and s.request.constraint is None and is_plain_greedy(s.request.sampling_params)
                for s in scheduled
            ):
                # The graph's argmax is the sampler's answer: skip building a SamplingBatch.
                return self._output([s.request for s in scheduled], greedy_ids.tolist(), None)
            logits, sampling = self._sampling_rows(logits, scheduled)
        else:
            logits, sampling = self._forward_eager(scheduled)
        if logits is None:
            return RunnerOutput()
        requests = [s.request for s in sampling]
        # Host-side grammar masks, built while an accelerator still runs the (asynchronous) forward.
        masks = build_token_masks(requests, self.vocab_size, pin_memory=self.device.type == "cuda")
        batch = SamplingBatch.build(
            params=[r.sampling_params for r in requests],
            prompt_token_ids=[r.prompt_token_ids for r in requests],
            output_token_ids=[r.output_token_ids for r in requests],
            generators=[self._generator(r.request_id, r.sampling_params.seed) for r in requests],
            vocab_size=logits.shape[-1],
            device=self.device,
            token_bitmask=masks.bitmask,
            force_greedy=masks.force_greedy,
            dry_breakers=self._breakers()
            if any(r.sampling_params.dry_multiplier for r in requests)
            else None,
            eos_token_ids=[r.eos_token_ids for r in requests],
        )
        sampled = self.sampler(logits, batch)
        token_ids = sampled.sampled_token_ids.tolist()  # the one host sync of a step
        return self._output(requests, token_ids, sampled.logprobs)

    def can_launch_greedy(self, num_seqs: int) -> bool:
        """`launch_greedy` can run `num_seqs` one-token decodes (in a CUDA graph where there are graphs)."""
        return self.graphs is None or num_seqs <= self.graphs.max_batch_size

    @torch.inference_mode()
    def launch_greedy(
        self, scheduled: list[ScheduledRequest], previous: PendingTokens | None = None, rows: list[int] = ()
    ) -> PendingTokens:
        """Queue one decode step of plain-greedy, one-token requests and return its argmax without
        waiting for it (engine/overlap.py). With `previous`, row i's input token is row `rows[i]` of
        that step's ids, which the host may not have read yet."""
        input_ids = None
        if previous is not None:
            if list(rows) == list(range(len(scheduled))):
                input_ids = previous.device_ids[: len(scheduled)]
            else:  # some requests of the previous step have stopped
                index = torch.tensor(rows, dtype=torch.int64, pin_memory=self.device.type == "cuda")
                input_ids = previous.device_ids.index_select(0, index.to(self.device, non_blocking=True))
        if self.graphs is not None and self.graphs.can_run(scheduled):
            _logits, greedy_ids = self.graphs.run(scheduled, input_ids)
        else:
            inputs = build_model_inputs(scheduled, self.block_size, self.device)
            if input_ids is not None:  # one token per row: rows and tokens line up
                inputs.input_ids = input_ids
            with forward_context(inputs.attn):
                hidden = self.model(inputs.input_ids, inputs.positions)
            _logits, greedy_ids = logits_and_greedy(self.model, hidden[inputs.logits_indices])
        return self._pending_buffers.stage(greedy_ids)

    @staticmethod
    def _output(
        requests: list[Request], token_ids: list[int], logprobs: list[Logprob | None] | None
    ) -> RunnerOutput:
        output = RunnerOutput()
        for row, (request, token_id) in enumerate(zip(requests, token_ids, strict=True)):
            output.sampled_token_ids[request.request_id] = token_id
            if logprobs is not None and logprobs[row] is not None:
                output.logprobs[request.request_id] = logprobs[row]
        return output

    @torch.inference_mode()
    def forward(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[torch.Tensor | None, list[ScheduledRequest]]:
        """The step's logits [num_sampling, vocab] (None when nothing samples) and the requests they
        belong to. Tensor-parallel ranks other than 0 call only this: they compute, rank 0 samples."""
        if self._graphs_can_run(scheduled):
            logits, _greedy_ids = self.graphs.run(scheduled)
            return self._sampling_rows(logits, scheduled)
        return self._forward_eager(scheduled)

    def _forward_eager(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[torch.Tensor | None, list[ScheduledRequest]]:
        num_decodes = _num_leading_decodes(scheduled) if self.split_mixed_steps else 0
        if 0 < num_decodes < len(scheduled):
            # With low-bit decode copies a step that computes prompt tokens runs on the dense weights
            # (so a prompt's KV never depends on the prefix cache). Its decode rows would then decode on
            # other weights than in a decode-only step, and an answer would depend on whether another
            # request's prompt arrived meanwhile (SmolLM2 int4: 3 of 8 answers changed). So they run as
            # the decode-only step they would otherwise be, and the prompt rows after them.
            decode_logits, decode_rows = self._forward_eager(scheduled[:num_decodes])
            prompt_logits, prompt_rows = self._forward_eager(scheduled[num_decodes:])
            parts = [logits for logits in (decode_logits, prompt_logits) if logits is not None]
            return (torch.cat(parts) if parts else None), decode_rows + prompt_rows
        inputs = build_model_inputs(scheduled, self.block_size, self.device)
        embeds = (
            None
            if self.images is None
            else self.images.inputs_embeds(scheduled, inputs.input_ids, inputs.attn.query_start_loc_cpu)
        )
        with forward_context(inputs.attn):
            if embeds is None:  # text: every step of a text model, and image models' text steps
                hidden = self.model(inputs.input_ids, inputs.positions)  # [num_tokens, hidden_size]
            else:
                hidden = self.model(inputs.input_ids, inputs.positions, embeds)
        if not inputs.sampling:
            return None, []
        return self.model.compute_logits(hidden[inputs.logits_indices]), inputs.sampling  # [n, vocab]

    def _graphs_can_run(self, scheduled: list[ScheduledRequest]) -> bool:
        """A decode graph runs on ids: never for a step with an image token (a one-token chunk can be
        one, re-prefilling a preempted request)."""
        return (
            self.graphs is not None
            and self.graphs.can_run(scheduled)
            and (self.images is None or not self.images.touches(scheduled))
        )

    def _sampling_rows(
        self, logits: torch.Tensor, scheduled: list[ScheduledRequest]
    ) -> tuple[torch.Tensor | None, list[ScheduledRequest]]:
        """The graph's logits ([num_seqs, vocab], one row per one-token sequence) of the rows that sample."""
        rows = [i for i, s in enumerate(scheduled) if s.samples]
        if not rows:
            return None, []
        if len(rows) < len(scheduled):
            logits = logits[torch.tensor(rows, device=self.device)]
        return logits, [scheduled[i] for i in rows]

    @torch.inference_mode()
    def copy_blocks_out(self, block_ids: list[int]) -> list[torch.Tensor]:
        """A CPU copy of these blocks' KV, per layer [2, len(block_ids) * block_size, kv_heads, head_dim]
        (for the disk tier: the copy is written later, while the blocks may be reused)."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        copies = []
        for cache in self.kv_caches:
            blocks = cache.index_select(1, ids)  # [2, n, block_size, heads, head_dim], a copy
            copies.append(blocks.flatten(1, 2).to("cpu"))
        return copies

    @torch.inference_mode()
    def copy_blocks_in(self, block_ids: list[int], kv: list[torch.Tensor]) -> None:
        """Write KV read from disk (per layer [2, len(block_ids) * block_size, kv_heads, head_dim])
        into these blocks."""
        assert len(kv) == len(self.kv_caches)
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        for cache, layer in zip(self.kv_caches, kv, strict=True):
            blocks = layer.reshape(2, len(block_ids), self.block_size, *layer.shape[2:])
            cache.index_copy_(1, ids, blocks.to(device=self.device, dtype=cache.dtype))

    def release(self, request_ids: list[str]) -> None:
        """Forget per-request sampling state (seeded generators) of finished requests."""
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    def _breakers(self) -> np.ndarray:
        """DRY's sequence-breaker tokens of this vocabulary (rows past the tokenizer's: none)."""
        if self._dry_breakers is None:
            texts = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            mask = breaker_mask(texts)
            self._dry_breakers = np.pad(mask, (0, max(0, self.vocab_size - len(mask))))
        return self._dry_breakers

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        # Created once per request so a seeded request's draws continue across steps.
        if request_id not in self._generators:
            self._generators[request_id] = make_generator(seed, self.device)
        return self._generators[request_id]


def _num_leading_decodes(scheduled: list[ScheduledRequest]) -> int:
    """How many of the step's first requests are one-token decodes (the scheduler puts them first)."""
    count = 0
    for s in scheduled:
        if not s.is_decode:
            break
        count += 1
    return count
