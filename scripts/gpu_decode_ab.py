"""A/B of the single-stream decode levers on the GPU, same process, same weights. Prints decode
tok/s and the batch-1 graph replay time for each variant.
- `--variants levers` (default): programmatic dependent launch of the layer kernels (KVSERVE_PDL)
  and overlapped ("async") scheduling, all four combinations, at 1/64/256 streams;
- `--variants head`: with both on, the LM head as a GEMV with its argmax fused
  (KVSERVE_GEMV_HEAD) and small GEMV weights loaded whole before the PDL wait
  (KVSERVE_GEMV_FULL_K_MB), at 1/64 streams.
Run on the device machine: python3 scripts/gpu_decode_ab.py [--shape llama-3.2-1b] [--variants head]"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch

from kvserve.bench.engine_bench import bench_kvserve
from kvserve.bench.shapes import build_hf_model, random_loaded_model
from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.models.layers import gemv, triton_launch


def replay_ms(engine: EngineCore, size: int = 1) -> float:
    graph = engine.runner.graphs._graphs[size].graph
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(100):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 100


# (pdl, async_scheduling, gemv_full_k_mb, gemv_head)
VARIANTS = {
    "levers": [(pdl, overlap, 0.0, False) for pdl in (False, True) for overlap in (False, True)],
    "head": [
        (True, True, 0.0, False),
        (True, True, 0.0, True),
        (True, True, 16.0, True),  # the defaults
        (True, True, 0.0, False),  # the first again: drift between the ends of the run
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "decode_ab.json"))
    parser.add_argument("--variants", choices=sorted(VARIANTS), default="levers")
    args = parser.parse_args()
    concurrencies = [1, 64, 256] if args.variants == "levers" else [1, 64]
    hf = build_hf_model(args.shape, torch.bfloat16, "cuda")
    loaded = random_loaded_model(args.shape, hf, torch.bfloat16, "cuda")
    del hf
    results = []
    for pdl, overlap, full_k_mb, head in VARIANTS[args.variants]:
        triton_launch.PDL_ENABLED, gemv.FULL_K_MAX_MB, gemv.HEAD_ENABLED = pdl, full_k_mb, head
        config = EngineConfig(
            model="random",
            dtype="bfloat16",
            device="cuda",
            async_scheduling=overlap,
            cache=CacheConfig(kv_cache_memory_mb=8192),
            scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192),
        )
        engine = EngineCore(config, loaded)
        result = bench_kvserve(engine, [], concurrencies, decode_tokens=256, repeats=3)
        row = {"pdl": pdl, "async_scheduling": overlap, "gemv_full_k_mb": full_k_mb, "gemv_head": head}
        row["replay_x1_ms"] = min(replay_ms(engine) for _ in range(5))
        row |= {f"decode_x{c}": round(v, 1) for c, v in result.decode_tok_s.items()}
        print(json.dumps(row), flush=True)
        results.append(row)
        engine.shutdown()
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"shape": args.shape, "variants": args.variants, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
