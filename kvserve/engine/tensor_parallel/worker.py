"""The process of one tensor-parallel rank > 0: it loads its shard, builds the same KV pool and
runner as rank 0 (same collectives, same order), then follows rank 0's control messages."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvserve.config import EngineConfig
from kvserve.distributed.group import TPGroup, destroy_tp_group, init_tp_group
from kvserve.distributed.kv_shards import (
    empty_shard,
    gather_to_driver,
    read_blocks,
    scatter_from_driver,
    write_blocks,
)
from kvserve.engine.runner.model_runner import ModelRunner
from kvserve.engine.tensor_parallel.driver import kv_head_spans
from kvserve.engine.tensor_parallel.messages import CopyIn, CopyOut, Stop
from kvserve.engine.tensor_parallel.plan import PlanDecoder, StepPlan
from kvserve.models.loaded import LoadedModel

logger = logging.getLogger(__name__)

# (this rank's group, the config with this rank's device) -> this rank's shard of the model.
ShardLoader = Callable[[TPGroup, EngineConfig], LoadedModel]


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    world_size: int
    init_method: str
    config: EngineConfig  # resolved, with rank 0's device
    load: ShardLoader  # picklable (a module-level function or a partial of one)


def device_for_rank(device: str, rank: int) -> str:
    """cuda / cuda:N -> the rank's own GPU (N + rank); CPU ranks share the CPU."""
    if not device.startswith("cuda"):
        return device
    base = int(device.split(":")[1]) if ":" in device else 0
    return f"cuda:{base + rank}"


def share_cpu_threads(device: torch.device, world_size: int) -> int:
    """CPU ranks split the cores (else each rank's intra-op pool oversubscribes them); returns the
    previous thread count."""
    previous = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, previous // world_size))
    return previous


def run_worker(spec: WorkerSpec) -> None:
    """Entry point of a spawned rank (blocks until rank 0 sends Stop)."""
    from kvserve.engine.kv_pool import build_runner, resolve_kv_pool  # after spawn: keeps the import light

    # Ctrl-C and SIGTERM reach the whole process group; rank 0 turns them into a clean shutdown
    # (its shutdown saves still need this rank's KV), then sends Stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    config = dataclasses.replace(spec.config, device=device_for_rank(spec.config.device, spec.rank))
    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    share_cpu_threads(device, spec.world_size)
    group = init_tp_group(spec.rank, spec.world_size, spec.init_method, device)
    loaded = spec.load(group, config)
    group.all_gather_object(loaded.fingerprint)  # rank 0 combines them into the cache key
    max_model_len, num_blocks = resolve_kv_pool(config, loaded)
    runner = build_runner(config, loaded, group.min_int(num_blocks), max_model_len)
    max_heads = max(span.size for span in kv_head_spans(loaded.arch, spec.world_size))
    _serve(group, runner, max_heads)
    destroy_tp_group(group)


@torch.inference_mode()
def _serve(group: TPGroup, runner: ModelRunner, max_heads: int) -> None:
    decoder = PlanDecoder()
    while True:
        message = group.broadcast_object()
        if isinstance(message, StepPlan):
            runner.forward(decoder.decode(message))
        elif isinstance(message, CopyOut):
            gather_to_driver(group, read_blocks(runner.kv_caches, message.block_ids, max_heads))
        elif isinstance(message, CopyIn):
            like = empty_shard(runner.kv_caches, len(message.block_ids), max_heads)
            write_blocks(runner.kv_caches, message.block_ids, scatter_from_driver(group, None, like))
        elif isinstance(message, Stop):
            return
        else:
            raise TypeError(f"unknown control message {type(message).__name__}")


def _exit_with_parent() -> None:
    """A rank whose rank 0 died (killed, crashed) would wait on the control group forever."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="kvserve-tp-parent-watch", daemon=True).start()
