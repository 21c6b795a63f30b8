"""The engine alone on `bench serve`'s workload: the ceiling that HTTP is measured against (issue 21).

`bench engine`'s decode figure is a steady decode of C streams, prefill excluded; `bench serve` with
`--num-prompts 2C --max-concurrency C` sends C prompts at once, starts another as each one ends, and
divides every output token by the whole wall time, prefill phases included. This script runs that same
workload through `EngineCore` directly (same random prompt lengths, greedy, `ignore_eos`, at most C in
flight, a new request as soon as one finishes) and reports output tok/s and median TTFT the same way.

    python scripts/engine_workload_bench.py --model DIR --device cuda --concurrency 1,16,64,256 --json OUT
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path


class StepLog:
    """Each `core.step()`'s wall time beside the plan the scheduler made in it.

    An overlapped decode step plans step n + 1 and reads step n, so its time is the host's share of
    one decode step plus the wait for the device; a plain step plans, runs and reads one batch.
    Steps are grouped by kind: decode-only (one token per request), or with prompt tokens (a prefill,
    or decodes mixed with a prompt: the eager kind).
    """

    def __init__(self, core) -> None:
        self.rows: list[tuple[float, int, int]] = []  # (seconds, requests, tokens)
        self._plan = (0, 0)
        schedule = core.scheduler.schedule

        def logged():
            out = schedule()
            self._plan = (len(out.scheduled), out.num_batched_tokens)
            return out

        core.scheduler.schedule = logged

    def step(self, core) -> list:
        self._plan = (0, 0)
        start = time.perf_counter()
        outputs = core.step()
        self.rows.append((time.perf_counter() - start, *self._plan))
        return outputs

    def summary(self) -> dict:
        kinds: dict[str, list[tuple[float, int, int]]] = {"decode": [], "with_prompt": [], "read_only": []}
        for row in self.rows:
            _, requests, tokens = row
            kinds["read_only" if not requests else "decode" if tokens == requests else "with_prompt"].append(
                row
            )
        out = {}
        for kind, rows in kinds.items():
            if rows:
                out[kind] = {
                    "steps": len(rows),
                    "total_s": round(sum(r[0] for r in rows), 4),
                    "median_ms": round(1000 * statistics.median(r[0] for r in rows), 3),
                    "mean_requests": round(statistics.mean(r[1] for r in rows), 1),
                    "mean_tokens": round(statistics.mean(r[2] for r in rows), 1),
                }
        return out


def run(
    core,
    concurrency: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    step_log: StepLog | None = None,
) -> dict:
    from kvserve.engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = core.loaded.arch.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(num_prompts)]
    sent: dict[str, float] = {}
    ttft: dict[str, float] = {}
    tokens = 0
    next_prompt = 0
    start = time.perf_counter()

    def add() -> None:
        nonlocal next_prompt
        request_id = f"w{concurrency}-{next_prompt}"
        core.add_request(core.make_request(request_id, prompts[next_prompt], params))
        sent[request_id] = time.perf_counter()
        next_prompt += 1

    while next_prompt < min(concurrency, num_prompts):
        add()
    while core.has_unfinished_requests():
        for output in step_log.step(core) if step_log else core.step():
            if output.new_token_ids:
                tokens += len(output.new_token_ids)
                ttft.setdefault(output.request_id, time.perf_counter() - sent[output.request_id])
            if output.finished and next_prompt < num_prompts:
                add()
    duration = time.perf_counter() - start
    result = {
        "output_throughput": tokens / duration,
        "median_ttft_ms": 1000 * statistics.median(ttft.values()),
        "duration_s": duration,
    }
    if step_log is not None:
        result["steps"] = step_log.summary()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument(
        "--warmup", action="store_true", help="one untimed wave of each concurrency before its timed run"
    )
    p.add_argument(
        "--step-log",
        action="store_true",
        help="time every engine step and report them by kind (decode-only, with prompt tokens)",
    )
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()

    from kvserve.cli.engine_host import build_warm_engine
    from kvserve.config import EngineConfig, SchedulerConfig

    # The scheduler's 0 = by device, as `kvserve serve` leaves it (CUDA: 256 sequences, 8,192 tokens).
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_model_len=args.ctx,
        kv_store=None,
        scheduler=SchedulerConfig(max_num_seqs=0, max_num_batched_tokens=0),
    )
    core = build_warm_engine(config)
    results = {}
    step_log = StepLog(core) if args.step_log else None
    for c in (int(x) for x in args.concurrency.split(",")):
        n = max(c * args.waves, args.min_prompts)
        if args.warmup:  # the same shapes once, so first-use costs (kernel compiles) are not timed
            run(core, c, c, args.input_len, args.output_len, seed=c + 1)
        if step_log is not None:
            step_log.rows.clear()
        results[c] = run(core, c, n, args.input_len, args.output_len, seed=c, step_log=step_log)
        print(f"engine workload c={c}: {results[c]}", flush=True)
    args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
