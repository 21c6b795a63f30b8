"""A/B of the CPU decode attention paths in one process: the decode workspace vs gathering every
KV block from the pool each step (a workspace with no budget), interleaved, SmolLM2 bf16.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/decode_workspace_ab.py --streams 16 --prompt-len 1024
"""

from __future__ import annotations

import argparse
import time
import uuid

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.build import build_engine
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.attention.decode_workspace import DecodeWorkspace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="timed decode steps per repeat and mode")
    args = parser.parse_args()
    config = EngineConfig(
        model="smollm2",
        device="cpu",
        max_model_len=4096,
        scheduler=SchedulerConfig(max_num_seqs=args.streams, max_num_batched_tokens=2048),
    )
    engine = build_engine(config, progress=False)
    backend = engine.loaded.model.model.layers[0].self_attn.backend
    vocab = engine.loaded.arch.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    requests = [
        engine.make_request(uuid.uuid4().hex, make_prompt(args.prompt_len, vocab, 7 + i), params)
        for i in range(args.streams)
    ]
    for request in requests:
        engine.add_request(request)
    while any(r.num_output_tokens == 0 for r in requests):
        engine.step()
    modes = {"workspace": backend.workspace, "gather": DecodeWorkspace(max_bytes=0)}
    step_ms: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, workspace in modes.items():
            backend.workspace = workspace
            engine.step()  # the switch refills the workspace's rows: not timed
            start = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            step_ms[name].append((time.perf_counter() - start) / args.steps * 1e3)
    print(f"{args.streams} streams, ~{args.prompt_len}-token contexts, {torch.get_num_threads()} thread(s)")
    for name, values in step_ms.items():
        values.sort()
        print(f"  {name:9s} step: min {values[0]:.1f} ms, median {values[len(values) // 2]:.1f} ms")


if __name__ == "__main__":
    main()
