"""A/B of the fp32 low-bit levers in one engine, interleaved (SmolLM2, --weight-quant int4): the
one-call decode stack vs the per-layer path, and the int4 prefill GEMM (--int8-prefill) vs the dense
fp32 GEMM.

    .venv/bin/python scripts/cpu_lowbit_ab.py --threads 1

Each variant is switched on the same engine (same weights, same KV) and the variants alternate every
`--steps` decode steps (or every prefill), so all see the same machine load (the VMs here are shared).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.cli.engine_args import build_engine
from kvserve.config import EngineConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext, lowbit_cpu


def set_variant(engine: EngineCore, *, stack: bool, gemm: bool) -> None:
    """Switch the levers (module-level toggles restored by the next call)."""
    causal_lm = engine.runner.model
    causal_lm.model.reset_decode_stack()
    if not stack:
        causal_lm.model._decode_stack_built = True  # as if it could not be built: per-layer path
    lowbit_cpu.lowbit_gemm = _GEMM if gemm else (lambda *args, **kwargs: None)


_GEMM = lowbit_cpu.lowbit_gemm


def timed(fn: Callable[[], None]) -> float:
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_ext.load() is not None, "the CPU kernels do not build or run here"
    config = EngineConfig(
        model="smollm2",
        device="cpu",
        dtype="float32",
        weight_quant="int4",
        max_model_len=4096,
        int8_prefill=True,
    )
    engine = build_engine(config, progress=False)
    prefill_ms: dict[str, list[float]] = {"dense fp32 GEMM (before)": [], "int4 x int8 GEMM (after)": []}
    one_token = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    seeds = iter(range(1000, 2000))  # a fresh prompt every time: no prefix-cache hits
    for i in range(args.repeats + 1):  # round 0: warm-up, not kept
        for name, values in prefill_ms.items():
            set_variant(engine, stack=True, gemm=name.startswith("int4"))
            prompt = make_prompt(args.prefill_len, 49152, next(seeds))
            engine.add_request(engine.make_request(uuid.uuid4().hex, prompt, one_token))
            ms = timed(lambda: [engine.step() for _ in iter(engine.has_unfinished_requests, False)])
            if i:
                values.append(ms)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    engine.add_request(engine.make_request(uuid.uuid4().hex, make_prompt(args.prompt_len, 49152, 7), params))
    for _ in range(3):
        engine.step()
    decode_variants = {
        "per-layer path (before)": {"stack": False, "gemm": True},
        "one-call stack (after)": {"stack": True, "gemm": True},
    }
    step_ms: dict[str, list[float]] = {name: [] for name in decode_variants}
    for _ in range(args.repeats):
        for name, variant in decode_variants.items():
            set_variant(engine, **variant)
            engine.step()  # builds the stack where it is on: not timed
            step_ms[name].append(timed(lambda: [engine.step() for _ in range(args.steps)]) / args.steps)
    set_variant(engine, stack=True, gemm=True)
    print(
        f"SmolLM2 fp32 --weight-quant int4, {args.threads} thread(s); medians (min) over {args.repeats} rounds"
    )
    print(f"decode, one stream, ~{args.prompt_len}-token context, ms per step:")
    for name, values in step_ms.items():
        values.sort()
        print(f"  {name:44s} {values[len(values) // 2]:6.1f} ({values[0]:5.1f})")
    print(f"prefill of {args.prefill_len} tokens (one request, nothing else running), ms:")
    for name, values in prefill_ms.items():
        values.sort()
        print(f"  {name:44s} {values[len(values) // 2]:6.1f} ({values[0]:5.1f})")


if __name__ == "__main__":
    main()
