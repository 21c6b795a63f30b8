"""ms per single-stream decode step of an fp32 CPU engine at given context lengths, in one process.

    PYTHONPATH=. .venv/bin/python scripts/cpu_decode_context.py --model gemma3-270m --weight-quant int4 \
        --contexts 2048,12288 [--breakdown] [--kv-dtype float32]

For each context: a fresh request with a prompt of that many tokens is prefilled, then timed over
`--rounds` rounds of `--steps` decode steps (median and min per step). `--breakdown` also times the
pieces of a step: the one-call decode stack (layers with their attention), the low-bit LM head, and
the model forward and logits as a whole (the rest of the step is the engine around them). To compare
two versions of the code, run it once per checkout (PYTHONPATH) in the same minutes.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.sampling_params import SamplingParams

TIMED: dict[str, float] = collections.defaultdict(float)


def timed(owner: Any, name: str, key: str | Callable[[tuple], str]) -> None:
    """Wrap owner.name so that its calls add their wall time to TIMED[key]."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMED[key(args) if callable(key) else key] += time.perf_counter() - begin

    setattr(owner, name, wrapper)


def add_breakdown_timers(vocab_size: int) -> None:
    from kvserve.models import blocks, common, decode_stack
    from kvserve.models.layers import lowbit_cpu

    timed(decode_stack.CpuDecodeStack, "forward", "decode stack")
    timed(
        lowbit_cpu, "lowbit_linear", lambda a: "LM head" if a[1].shape[0] == vocab_size else "per-layer GEMVs"
    )
    timed(blocks.Attention, "attend_qkv", "per-layer attention")
    timed(common.CausalLMBase, "forward", "model forward")
    timed(common.CausalLMBase, "compute_logits", "logits")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--weight-quant", default="int4", choices=("none", "int8", "int4"))
    parser.add_argument("--contexts", default="2048,12288")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    config = EngineConfig(
        model=args.model, device="cpu", dtype="float32", weight_quant=args.weight_quant,
        max_model_len=max(contexts) + 4096, cache=CacheConfig(kv_dtype=args.kv_dtype),
    )  # fmt: skip
    engine = build_engine(config, progress=False)
    vocab_size = engine.loaded.arch.vocab_size
    if args.breakdown:
        add_breakdown_timers(vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    for ctx in contexts:
        request = engine.make_request(uuid.uuid4().hex, make_prompt(ctx, vocab_size, ctx), params)
        engine.add_request(request)
        while not any(output.new_token_ids for output in engine.step()):  # the prefill
            pass
        for _ in range(3):
            engine.step()
        TIMED.clear()
        rounds = []
        for _ in range(args.rounds):
            begin = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            rounds.append((time.perf_counter() - begin) / args.steps * 1e3)
        print(
            f"{args.model} fp32 --weight-quant {args.weight_quant} KV {engine.config.cache.kv_dtype}, context {ctx}: "
            f"median {statistics.median(rounds):.1f} ms per step, min {min(rounds):.1f} ms"
        )
        steps = args.rounds * args.steps
        for key, seconds in TIMED.items():
            print(f"    {key}: {seconds / steps * 1e3:.2f} ms per step")
        engine.abort_request(request.request_id)
        engine.step()


if __name__ == "__main__":
    main()
