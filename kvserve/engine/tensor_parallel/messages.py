"""The control messages rank 0 broadcasts to the other ranks, one per collective phase.

Every rank handles them in the order sent, so the collectives they start line up: a StepPlan
runs one forward, CopyOut gathers KV blocks to rank 0, CopyIn scatters disk KV, Stop ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.engine.tensor_parallel.plan import StepPlan


@dataclass(frozen=True)
class CopyOut:
    block_ids: list[int]


@dataclass(frozen=True)
class CopyIn:
    block_ids: list[int]


@dataclass(frozen=True)
class Stop:
    pass


ControlMessage = StepPlan | CopyOut | CopyIn | Stop
