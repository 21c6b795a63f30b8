"""kvserve vs llama.cpp on one CPU thread, interleaved in one process: single-stream decode and
prefill, the two engines taking turns every round so both see the same machine load.

    .venv/bin/python scripts/cpu_vs_llama_ab.py --rounds 8

`kvserve bench engine` runs all of kvserve's figures and then all of llama.cpp's, minutes apart; on
the shared 2-core VMs here the load changes in between (the two runs of 2026-12-04 17:00-17:13 gave
0.63x and 1.16x for the same code). Same GGUF (SmolLM2 Q4_1) for both. kvserve runs each
`--config DTYPE:QUANT[:int8-prefill|bf16-prefill]` (default: the CLI's defaults, `auto:auto`: int4
for this Q4 file, in fp32, with bf16 prefill weights on CPUs with AVX512-BF16/AMX), e.g.

    .venv/bin/python scripts/cpu_vs_llama_ab.py --config auto:auto bfloat16:int4 float32:int4:int8-prefill
"""

from __future__ import annotations

import argparse
import time
import uuid

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.aliases import list_known_models

VOCAB = 49152


def kvserve_engine(spec: str) -> EngineCore:
    """`DTYPE:QUANT[:int8-prefill|bf16-prefill]`, as --dtype, --weight-quant and the prefill flags take them."""
    dtype, quant, *rest = spec.split(":")
    config = EngineConfig(
        model="smollm2", device="cpu", dtype=dtype, weight_quant=quant, max_model_len=4096,
        int8_prefill="int8-prefill" in rest, bf16_prefill="bf16-prefill" in rest, cache=CacheConfig(kv_cache_memory_mb=512),
    )  # fmt: skip
    return build_engine(config, progress=False)


def kvserve_prefill_s(engine: EngineCore, prompt: list[int]) -> float:
    engine.add_request(engine.make_request(uuid.uuid4().hex, prompt, SamplingParams(max_tokens=1)))
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=32, help="per engine per round")
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="for both engines")
    parser.add_argument(
        "--config", nargs="+", default=["auto:auto"], help="DTYPE:QUANT[:int8-prefill|bf16-prefill]"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llama_cpp import Llama

    path = next(m for m in list_known_models() if m.name == "smollm2").path
    llm = Llama(model_path=str(path), n_ctx=4096, n_batch=512, n_threads=args.threads, verbose=False)
    prefilling = {spec: kvserve_engine(spec) for spec in args.config}
    # Their own engines: the prefill engines must go idle between rounds.
    decoding = {spec: kvserve_engine(spec) for spec in args.config}
    greedy = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    for spec, engine in decoding.items():
        engine.add_request(engine.make_request("decode", make_prompt(128, VOCAB, 7), greedy))
        for _ in range(3):
            engine.step()
        resolved = engine.config
        print(f"{spec}: dtype {resolved.dtype}, weight-quant {resolved.weight_quant}", flush=True)
    llm.reset()
    llm.eval(make_prompt(128, VOCAB, 7))
    token = llm.sample(temp=0.0)
    decode: dict[str, list[float]] = {name: [] for name in [*args.config, "llama.cpp"]}
    prefill: dict[str, list[float]] = {name: [] for name in [*args.config, "llama.cpp"]}
    seed = 100
    for _ in range(args.rounds):
        for spec, engine in decoding.items():
            start = time.perf_counter()
            for _ in range(args.decode_tokens):
                engine.step()
            decode[spec].append(args.decode_tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        for _ in range(args.decode_tokens):
            llm.eval([token])
            token = llm.sample(temp=0.0)
        decode["llama.cpp"].append(args.decode_tokens / (time.perf_counter() - start))
        seed += 1
        prompt = make_prompt(args.prefill_len, VOCAB, seed)  # new every round: no prefix-cache hits
        for spec, engine in prefilling.items():
            prefill[spec].append(args.prefill_len / kvserve_prefill_s(engine, prompt))
        ids = llm.input_ids[: llm.n_tokens].tolist()  # llama.cpp's decode state, restored below
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill["llama.cpp"].append(args.prefill_len / (time.perf_counter() - start))
        llm.reset()
        llm.eval(ids)
    llama_decode, llama_prefill = median(decode["llama.cpp"]), median(prefill["llama.cpp"])
    print(
        f"SmolLM2 Q4_1 GGUF, {args.threads} thread(s) each, {args.rounds} interleaved rounds, medians (tok/s):"
    )
    for spec in args.config:
        value = median(decode[spec])
        ratios = [a / b for a, b in zip(decode[spec], decode["llama.cpp"], strict=True)]
        print(
            f"  decode, one stream: kvserve {spec} {value:.1f}, llama.cpp {llama_decode:.1f} -> "
            f"{value / llama_decode:.2f}x (per round: {' '.join(f'{r:.2f}' for r in ratios)})"
        )
    for spec in args.config:
        value = median(prefill[spec])
        print(
            f"  prefill {args.prefill_len}: kvserve {spec} {value:.1f}, llama.cpp {llama_prefill:.1f}"
            f" -> {value / llama_prefill:.2f}x"
        )


if __name__ == "__main__":
    main()
