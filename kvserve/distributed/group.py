"""The tensor-parallel group one engine process belongs to, and the collectives the model uses.

Two process groups: `device_group` carries activations (NCCL on CUDA, gloo on CPU) and
`cpu_group` (always gloo) carries the step plans and control messages, which are Python objects
that NCCL cannot move without a device copy, and which may wait as long as the server idles.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Workers wait on the control group for as long as the server idles between requests; the
# device group's collectives run in lockstep, so a long wait there means a rank is stuck.
_CONTROL_TIMEOUT = datetime.timedelta(days=365)
_DEVICE_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class TPGroup:
    rank: int
    world_size: int
    device_group: Any = None  # dist.ProcessGroup; None at world size 1
    cpu_group: Any = None

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    @property
    def is_driver(self) -> bool:
        """Rank 0 runs the scheduler and the sampler; the others follow its plans."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (row-parallel outputs, the vocab-parallel embedding)."""
        if self.is_parallel:
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on every rank -> [..., world_size * n], rank order (vocab-parallel logits)."""
        if not self.is_parallel:
            return x
        # Ranks stacked along dim 0 (the layout gloo and NCCL both take), then moved to the last dim.
        out = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous(), group=self.device_group)
        ranks_first = out.view(self.world_size, *x.shape)
        return ranks_first.movedim(0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (pickled over the gloo control group)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def min_int(self, value: int) -> int:
        """The smallest of every rank's value (e.g. the KV block count all pools can hold)."""
        return min(self.all_gather_object(value))


SINGLE = TPGroup(rank=0, world_size=1)


def init_tp_group(rank: int, world_size: int, init_method: str, device: torch.device) -> TPGroup:
    """Join the group (blocks until every rank has joined)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=_DEVICE_TIMEOUT
    )
    device_group = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
    logger.info("tensor parallel rank %d/%d joined (%s)", rank, world_size, backend)
    return TPGroup(rank, world_size, device_group, cpu_group)


def destroy_tp_group(group: TPGroup) -> None:
    if group.is_parallel and dist.is_initialized():
        dist.destroy_process_group()
