"""TPDriver: rank 0's runner at tensor-parallel size > 1.

It wraps rank 0's own ModelRunner and keeps its interface (execute, copy_blocks_out/in,
release), so EngineCore and DiskTier are unchanged: each call first broadcasts the control
message that makes every other rank enter the same forward or KV copy. Only rank 0 samples:
the sampler's state (seeded generators, penalties' history, grammar matchers) lives with the
scheduler's requests there, and the other ranks learn the sampled tokens from the next plan.
The logits are all-gathered anyway (a fixed-shape collective that CUDA graphs can capture).
"""

from __future__ import annotations

import atexit
import logging
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

import torch

from kvserve.distributed.group import TPGroup, destroy_tp_group
from kvserve.distributed.kv_shards import (
    assemble_heads,
    gather_to_driver,
    read_blocks,
    scatter_from_driver,
    split_heads,
    write_blocks,
)
from kvserve.distributed.partition import Span, attention_shard
from kvserve.engine.outputs import RunnerOutput, SchedulerOutput
from kvserve.engine.runner.model_runner import ModelRunner
from kvserve.engine.tensor_parallel.messages import CopyIn, CopyOut, Stop
from kvserve.engine.tensor_parallel.plan import PlanEncoder
from kvserve.models.config import ModelArchConfig

if TYPE_CHECKING:
    from kvserve.engine.runner.cuda_graphs import DecodeGraphs

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 30.0


def kv_head_spans(arch: ModelArchConfig, world_size: int) -> list[Span]:
    """Each rank's KV heads, in rank order."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    return [attention_shard(heads, kv_heads, world_size, rank).kv for rank in range(world_size)]


class TPDriver:
    def __init__(
        self, group: TPGroup, arch: ModelArchConfig, workers: list[BaseProcess], num_threads: int
    ) -> None:
        """`num_threads`: this process's torch thread count before the CPU ranks split the cores."""
        assert group.is_driver and group.is_parallel
        self.group, self.workers, self.num_threads = group, workers, num_threads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_spans = kv_head_spans(arch, group.world_size)
        self.max_heads = max(span.size for span in self.head_spans)
        self.encoder = PlanEncoder()
        self.runner: ModelRunner | None = None
        self._stopped = False

    def attach(self, runner: ModelRunner) -> TPDriver:
        self.runner = runner
        return self

    @property
    def local(self) -> ModelRunner:
        """Rank 0's own runner (its shard's KV pool)."""
        assert self.runner is not None, "attach() the rank-0 runner first"
        return self.runner

    @property
    def attention_backend(self) -> str:
        return self.local.attention_backend

    @property
    def graphs(self) -> DecodeGraphs | None:
        return self.local.graphs

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        self.group.broadcast_object(self.encoder.encode(scheduler_output.scheduled))
        return self.local.execute(scheduler_output)

    def release(self, request_ids: list[str]) -> None:
        self.local.release(request_ids)
        self.encoder.release(request_ids)

    @torch.inference_mode()
    def copy_blocks_out(self, block_ids: list[int]) -> list[torch.Tensor]:
        """Like ModelRunner.copy_blocks_out, with every rank's heads: [2, tokens, num_kv_heads, head_dim]."""
        self.group.broadcast_object(CopyOut(block_ids))
        shards = gather_to_driver(self.group, read_blocks(self.local.kv_caches, block_ids, self.max_heads))
        assert shards is not None
        return [layer.to("cpu") for layer in assemble_heads(shards, self.head_spans, self.num_kv_heads)]

    @torch.inference_mode()
    def copy_blocks_in(self, block_ids: list[int], kv: list[torch.Tensor]) -> None:
        self.group.broadcast_object(CopyIn(block_ids))
        caches = self.local.kv_caches
        layers = [layer.to(device=caches[0].device, dtype=caches[0].dtype) for layer in kv]
        shards = split_heads(layers, self.head_spans, self.max_heads)
        write_blocks(caches, block_ids, scatter_from_driver(self.group, shards, shards[0]))

    def shutdown(self) -> None:
        """Stop the other ranks and leave the group. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.shutdown)  # registered by start_tp_engine; drop the reference
        try:
            self.group.broadcast_object(Stop())
        except RuntimeError as error:  # a rank died already: terminate the rest below
            logger.warning("tensor parallel: could not send Stop: %s", error)
        for worker in self.workers:
            worker.join(_JOIN_TIMEOUT_S)
            if worker.is_alive():
                logger.warning("tensor parallel worker %s did not stop; terminating it", worker.name)
                worker.terminate()
        destroy_tp_group(self.group)
        torch.set_num_threads(self.num_threads)
