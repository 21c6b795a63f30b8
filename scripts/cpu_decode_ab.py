"""A/B of single-stream fp32 CPU decode in one process, interleaved: engines built with the CPU
decode kernels (cpu_ext) and without them (the torch paths), dense and with --weight-quant.

    .venv/bin/python scripts/cpu_decode_ab.py --threads 2 --quant none int8 int4
    .venv/bin/python scripts/cpu_decode_ab.py --threads 1 --streams 16 --quant none int4 --no-torch-path

Builds every engine first, then alternates them every `--steps` timed decode steps, so all see
the same machine load (the VMs here are shared and noisy).
"""

from __future__ import annotations

import argparse
import time
import uuid

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext


def start(quant: str, prompt_len: int, streams: int = 1) -> EngineCore:
    config = EngineConfig(
        model="smollm2", device="cpu", dtype="float32", weight_quant=quant, max_model_len=4096
    )
    engine = build_engine(config, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for i in range(streams):
        request = engine.make_request(uuid.uuid4().hex, make_prompt(prompt_len, 49152, 7 + i), params)
        engine.add_request(request)
    for _ in range(streams * prompt_len // 512 + 3):  # prefills (512-token steps) and warm-up decodes
        engine.step()
    return engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quant", nargs="+", default=["none", "int4"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--streams", type=int, default=1, help="sequences decoding together")
    parser.add_argument("--no-torch-path", action="store_true", help="skip the dense torch-path engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_ext.load() is not None, "the CPU kernels do not build or run here"
    engines: dict[str, EngineCore] = {}
    for quant in args.quant:
        engines[f"{quant} kernels"] = start(quant, args.prompt_len, args.streams)
        if (
            quant == "none" and not args.no_torch_path
        ):  # the low-bit paths have no torch equivalent worth timing on AVX2
            cpu_ext.ENABLED = False
            cpu_ext.load.cache_clear()
            engines[f"{quant} torch"] = start(quant, args.prompt_len, args.streams)
            cpu_ext.ENABLED = True
            cpu_ext.load.cache_clear()
    step_ms: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            torch_path = name.endswith("torch")
            cpu_ext.ENABLED = not torch_path
            cpu_ext.load.cache_clear()
            cpu_ext.load()  # re-imports the built module: not timed
            begin = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            step_ms[name].append((time.perf_counter() - begin) / args.steps * 1e3)
    print(
        f"SmolLM2 fp32, {args.streams} stream(s), ~{args.prompt_len}-token context, {args.threads} thread(s)"
    )
    for name, values in step_ms.items():
        values.sort()
        median = values[len(values) // 2]
        print(
            f"  {name:14s} step: min {values[0]:6.1f} ms, median {median:6.1f} ms"
            f" ({args.streams * 1e3 / median:5.1f} tok/s)"
        )


if __name__ == "__main__":
    main()
