"""Start a tensor-parallel engine: spawn ranks 1..N-1, join the group as rank 0, load rank 0's
shard and build the EngineCore around a TPDriver. The caller's process is rank 0, so the server,
the scheduler and the disk tier stay where they are at TP=1."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import shutil
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import xxhash

from kvserve.config import EngineConfig, resolve
from kvserve.distributed.group import TPGroup, destroy_tp_group, init_tp_group
from kvserve.engine.core import EngineCore
from kvserve.engine.tensor_parallel.driver import TPDriver
from kvserve.engine.tensor_parallel.worker import (
    ShardLoader,
    WorkerSpec,
    device_for_rank,
    run_worker,
    share_cpu_threads,
)
from kvserve.models.loaded import LoadedModel

logger = logging.getLogger(__name__)


class TPLaunchError(RuntimeError):
    """The ranks cannot be started (too few GPUs, a device the group cannot use)."""


def load_checkpoint_shard(group: TPGroup, config: EngineConfig, *, progress: bool = True) -> LoadedModel:
    """The default ShardLoader: this rank's shard of `config.model` (file or alias)."""
    from kvserve.models.loader import load_model

    show = progress and group.is_driver
    return load_model(
        config.model,
        config.torch_dtype,
        config.device,
        progress=show,
        tp=group,
        context=config.context_request,
        mmproj=config.mmproj,
    )


def start_tp_engine(config: EngineConfig, load: ShardLoader) -> EngineCore:
    """An EngineCore whose model is split over `config.tensor_parallel_size` ranks."""
    config = resolve(config)
    world_size = config.tensor_parallel_size
    _check_devices(config.device, world_size)
    rendezvous = Path(tempfile.mkdtemp(prefix="kvserve-tp-"))
    init_method = (rendezvous / "store").as_uri()
    context = mp.get_context("spawn")  # CUDA and gloo state must not be forked
    workers = [
        context.Process(
            target=run_worker,
            args=(WorkerSpec(rank, world_size, init_method, config, load),),
            name=f"kvserve-tp{rank}",
            daemon=True,
        )
        for rank in range(1, world_size)
    ]
    group: TPGroup | None = None
    num_threads = torch.get_num_threads()
    try:
        for worker in workers:
            worker.start()
        device = torch.device(device_for_rank(config.device, 0))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        num_threads = share_cpu_threads(device, world_size)
        group = _join_watching(workers, lambda: init_tp_group(0, world_size, init_method, device))
        loaded = load(group, config)
        loaded = dataclasses.replace(loaded, fingerprint=_group_fingerprint(group, loaded.fingerprint))
        engine = EngineCore(config, loaded, tp=TPDriver(group, loaded.arch, workers, num_threads))
    except BaseException:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        if group is not None:
            destroy_tp_group(group)
        torch.set_num_threads(num_threads)
        raise
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)
    # One-shot commands exit without EngineCore.shutdown(): stop the ranks cleanly anyway.
    atexit.register(engine.tp.shutdown)  # TPDriver.shutdown unregisters it
    logger.info("tensor parallel engine: %d ranks on %s", world_size, config.device)
    return engine


def _join_watching(workers: list[BaseProcess], join: Callable[[], TPGroup]) -> TPGroup:
    """Join the group on a helper thread while watching the workers: a rank that dies before it
    joins (a bad flag, an import error) would otherwise leave rank 0 waiting for the rendezvous
    timeout. Once joined, a dead peer breaks the connections and the collectives raise."""
    result: list[TPGroup | Exception] = []

    def run() -> None:
        try:
            result.append(join())
        except Exception as error:  # noqa: BLE001  # re-raised on the caller's thread below
            result.append(error)

    thread = threading.Thread(target=run, name="kvserve-tp-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        dead = [w for w in workers if w.exitcode is not None]
        if dead and thread.is_alive():
            raise TPLaunchError(
                f"tensor parallel rank {dead[0].name} exited ({dead[0].exitcode}) during start-up"
            )
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _group_fingerprint(group: TPGroup, own: str) -> str:
    """One identity for the whole sharded model: every rank's shard fingerprint plus the split.
    So KV blocks and disk checkpoints of a TP=2 run never mix with TP=1's or TP=4's."""
    digest = xxhash.xxh3_128(f"tp{group.world_size}".encode())
    for fingerprint in group.all_gather_object(own):
        digest.update(fingerprint.encode())
    return digest.hexdigest()


def _check_devices(device: str, world_size: int) -> None:
    if not device.startswith("cuda"):
        return
    last = int(device_for_rank(device, world_size - 1).split(":")[1])
    if last >= torch.cuda.device_count():
        raise TPLaunchError(
            f"--tensor-parallel-size {world_size} on {device} needs GPUs up to cuda:{last}; "
            f"{torch.cuda.device_count()} visible"
        )
