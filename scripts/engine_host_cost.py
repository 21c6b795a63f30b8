"""The engine's own host time per overlapped decode step, without a model (issue 21).

On a GPU the engine process's Python per step (plan the step, fill the CUDA graph's inputs, account
the launched step, read the previous one's tokens into outputs, ship them) runs while the device
computes the step before: once it takes longer than the device's step, the engine is host-bound, in
`bench engine` and still more behind HTTP front ends. This times each piece for N decoding streams
with the real `Scheduler`, `KVCacheManager`, CUDA-graph staging and IPC encoding, on any machine.
To compare two trees, run it with each on PYTHONPATH in turn, several times:

    for t in OLD NEW OLD NEW; do PYTHONPATH=$t python scripts/engine_host_cost.py --streams 256; done

Trees from before runner/decode_staging.py get the staging loop they had (four element writes per
row and a whole table row each).

`--mixed` times the other kind of step instead: N - 1 streams decoding while one new request's
prompt is prefilled (the steady state of a serving load where requests come and go), which runs
eagerly: schedule, `build_model_inputs`, the sampling batch and `Scheduler.update`.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import numpy as np

from kvserve.engine import ipc
from kvserve.engine.engine_process import coalesce
from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.outputs import RunnerOutput
from kvserve.engine.overlap import can_overlap
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import Scheduler

BLOCK = 16


def staging(max_seqs: int, max_blocks: int):
    try:
        from kvserve.engine.runner.decode_staging import StagedRows
    except ImportError:
        return _OldStaging(max_seqs, max_blocks)
    return StagedRows(np.zeros((4, max_seqs), np.int64), np.zeros((max_seqs, max_blocks), np.int32))


class _OldStaging:
    def __init__(self, max_seqs: int, max_blocks: int) -> None:
        self.packed = np.zeros((4, max_seqs), np.int64)
        self.tables = np.zeros((max_seqs, max_blocks), np.int32)

    def fill(self, scheduled, block_size: int, *, full_rows: bool, with_ids: bool) -> None:
        packed, tables = self.packed, self.tables
        for row, s in enumerate(scheduled):
            position = s.start
            packed[1, row] = position
            packed[2, row] = s.block_ids[position // block_size] * block_size + position % block_size
            packed[3, row] = position + 1
            num_blocks = position // block_size + 1
            tables[row, :num_blocks] = s.block_ids[:num_blocks]


def mixed_steps(args: argparse.Namespace) -> None:
    import torch

    from kvserve.engine.runner.batch import build_model_inputs
    from kvserve.engine.sampler import SamplingBatch

    kv = KVCacheManager(BLOCK, 64 * args.streams * (args.prompt_len // BLOCK + 64) // 32)
    scheduler = Scheduler(args.streams, 8192, kv, 8192)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)

    def prompt(i: int) -> list[int]:
        return [(7 * i + j) % 49_000 for j in range(args.prompt_len)]

    def run(plan) -> None:
        scheduler.update(plan, RunnerOutput({s.request.request_id: 7 for s in plan.scheduled if s.samples}))

    for i in range(args.streams - 1):
        scheduler.add_request(Request(f"chatcmpl-{i:08d}", prompt(i), params, eos_token_ids=(2,)))
    while scheduler.waiting or any(r.num_output_tokens == 0 for r in scheduler.running):  # prefill
        run(scheduler.schedule())
    names = ["schedule", "build_model_inputs", "sampling batch", "update"]
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu = torch.device("cpu")
    for step in range(args.steps):
        request_id = f"new-{step}"
        scheduler.add_request(Request(request_id, prompt(args.streams + step), params, eos_token_ids=(2,)))
        t = [time.perf_counter()]
        plan = scheduler.schedule()
        t.append(time.perf_counter())
        inputs = build_model_inputs(plan.scheduled, BLOCK, cpu)
        t.append(time.perf_counter())
        requests = [s.request for s in inputs.sampling]
        SamplingBatch.build(
            params=[r.sampling_params for r in requests],
            prompt_token_ids=[r.prompt_token_ids for r in requests],
            output_token_ids=[r.output_token_ids for r in requests],
            generators=[None] * len(requests),
            vocab_size=49_152,
            device=cpu,
        )
        t.append(time.perf_counter())
        run(plan)
        t.append(time.perf_counter())
        assert (
            len(plan.scheduled) == args.streams
            and plan.num_batched_tokens == args.streams - 1 + args.prompt_len
        )
        scheduler.abort_request(request_id)  # back to N - 1 streams for the next step
        run(scheduler.schedule())
        for name, start, end in zip(names, t[:-1], t[1:], strict=True):
            times[name].append(1e6 * (end - start))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{args.streams - 1} decodes + one {args.prompt_len}-token prompt, median us per step (torch threads "
        f"{torch.get_num_threads()}): "
        + ", ".join(f"{name} {value:.0f}" for name, value in medians.items())
        + f"; total {sum(medians.values()):.0f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--mixed", action="store_true", help="time mixed steps (N - 1 decodes + one prompt)")
    args = p.parse_args()
    if args.mixed:
        mixed_steps(args)
        return

    kv = KVCacheManager(BLOCK, 64 * args.streams * (args.prompt_len // BLOCK + 64) // 32)
    scheduler = Scheduler(args.streams, 8192, kv, 8192)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for i in range(args.streams):
        prompt = [(i + j) % 49_000 for j in range(args.prompt_len)]
        scheduler.add_request(Request(f"chatcmpl-{i:08d}", prompt, params, eos_token_ids=(2,)))
    while scheduler.waiting or any(r.num_output_tokens == 0 for r in scheduler.running):  # prefill
        plan = scheduler.schedule()
        scheduler.update(plan, RunnerOutput({s.request.request_id: 7 for s in plan.scheduled if s.samples}))
    buffers = [staging(args.streams, 8192 // BLOCK) for _ in range(2)]
    names = ["can_overlap", "schedule", "stage inputs", "update_pending", "resolve_pending", "encode+pickle"]
    times: dict[str, list[float]] = {name: [] for name in [*names, "front end decode"]}
    for step in range(args.steps):
        t = [time.perf_counter()]
        assert can_overlap(scheduler, kv.num_free_blocks)
        t.append(time.perf_counter())
        scheduled = scheduler.schedule().scheduled
        t.append(time.perf_counter())
        buffers[step % 2].fill(scheduled, BLOCK, full_rows=False, with_ids=False)
        t.append(time.perf_counter())
        scheduler.update_pending(scheduled)
        t.append(time.perf_counter())
        outputs = scheduler.resolve_pending([s.request for s in scheduled], [5] * len(scheduled))
        t.append(time.perf_counter())
        data = pickle.dumps(ipc.encode_outputs(coalesce([outputs])), ipc.PROTOCOL)
        t.append(time.perf_counter())
        [ipc.decode_output(item) for item in pickle.loads(data)]
        t.append(time.perf_counter())
        for name, start, end in zip(times, t[:-1], t[1:], strict=True):
            times[name].append(1e6 * (end - start))
    medians = {name: statistics.median(values) for name, values in times.items()}
    engine = sum(medians[name] for name in names)
    print(
        f"{args.streams} streams, median us per step: "
        + ", ".join(f"{name} {value:.0f}" for name, value in medians.items())
        + f"; engine total {engine:.0f} ({engine / args.streams:.1f} per stream)"
    )


if __name__ == "__main__":
    main()
