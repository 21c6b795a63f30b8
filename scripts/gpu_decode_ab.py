"""A/B of the two single-stream decode levers on the GPU, same process, same weights: programmatic
dependent launch of the layer kernels (KVSERVE_PDL) and overlapped ("async") scheduling. Prints
decode tok/s at 1/64/256 streams and the batch-1 graph replay time for each combination.
Run on the device machine: python3 scripts/gpu_decode_ab.py [--shape llama-3.2-1b]"""

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
from kvserve.models.layers import triton_launch


def replay_ms(engine: EngineCore, size: int = 1) -> float:
    graph = engine.runner.graphs._graphs[size].graph
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(100):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-3.2-1b")
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "decode_ab.json"))
    args = parser.parse_args()
    hf = build_hf_model(args.shape, torch.bfloat16, "cuda")
    loaded = random_loaded_model(args.shape, hf, torch.bfloat16, "cuda")
    del hf
    results = []
    for pdl in (False, True):
        for overlap in (False, True):
            triton_launch.PDL_ENABLED = pdl
            config = EngineConfig(
                model="random",
                dtype="bfloat16",
                device="cuda",
                async_scheduling=overlap,
                cache=CacheConfig(kv_cache_memory_mb=8192),
                scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192),
            )
            engine = EngineCore(config, loaded)
            result = bench_kvserve(engine, [], [1, 64, 256], decode_tokens=256, repeats=3)
            row = {"pdl": pdl, "async_scheduling": overlap, "replay_x1_ms": replay_ms(engine)}
            row |= {f"decode_x{c}": round(v, 1) for c, v in result.decode_tok_s.items()}
            print(json.dumps(row), flush=True)
            results.append(row)
            engine.shutdown()
            del engine
            gc.collect()
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"shape": args.shape, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
