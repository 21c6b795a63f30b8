"""Pickle + unpickle time of one step's outputs on the engine pipe (`kvserve/engine/ipc.py`): the
plain list of plain tuples it sends, against the same outputs wrapped in a frozen slotted
dataclass, one frozen slotted dataclass per output, and the `EngineOutput`s themselves.

    python scripts/ipc_message_cost.py --streams 256 1
"""

from __future__ import annotations

import argparse
import pickle
import timeit
import uuid
from dataclasses import dataclass
from typing import Any

from kvserve.engine import ipc
from kvserve.engine.outputs import EngineOutput


@dataclass(frozen=True, slots=True)
class TypedStep:
    outputs: list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class TypedOutput:
    request_id: str
    new_token_ids: tuple[int, ...]
    num_prompt_tokens: int
    num_cached_tokens: int


def step_outputs(num_streams: int) -> list[EngineOutput]:
    """A decode step: one new token per stream (request ids as ChatService makes them)."""
    return [
        EngineOutput(
            f"chatcmpl-{uuid.uuid4().hex[:24]}-{uuid.uuid4().hex[:8]}", (1000 + i,), (), None, 1500, 1024
        )
        for i in range(num_streams)
    ]


def round_trip_us(message: object, repeat: int) -> float:
    number = max(1, 20_000 // max(1, len(pickle.dumps(message)) // 50))
    timer = timeit.Timer(lambda: pickle.loads(pickle.dumps(message, ipc.PROTOCOL)))
    return 1e6 * min(timer.repeat(repeat, number)) / number


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[256, 1])
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats (the best is reported)")
    args = parser.parse_args()
    for num_streams in args.streams:
        outputs = step_outputs(num_streams)
        plain = ipc.encode_outputs(outputs)
        variants = {
            "list of tuples (sent)": plain,
            "typed message, tuple outputs": TypedStep(plain),
            "typed message, typed outputs": TypedStep([TypedOutput(*item) for item in plain]),
            "EngineOutput objects": outputs,
        }
        print(f"{num_streams} outputs per step, pickle + unpickle:")
        for name, message in variants.items():
            print(f"  {name:30s} {round_trip_us(message, args.repeat):9.1f} us")


if __name__ == "__main__":
    main()
