"""What a CPU server's RSS is made of, and where it stops: build the engine `kvserve serve` builds
(default: make serve's SmolLM2 at a 16K context), then write every block of its KV pool in quarters
and read the RSS after each, then once more over the whole pool.

The pool is allocated lazily (calloc'd pages, runner/model_runner.py), so RSS starts at the model and
runtime and grows by exactly the pool bytes first written; a second pass over written blocks adds
nothing. Serving writes blocks in the pool's free-list order (untouched blocks before evicting cached
ones), so under load RSS climbs to this ceiling and stays there (docs/reliability.md).

    .venv/bin/python scripts/kv_pool_rss.py [--ctx 16384] [--kv-cache-memory-mb 0] [--steps 4]
"""

from __future__ import annotations

import argparse

import psutil

from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.build import build_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument(
        "--kv-cache-memory-mb", type=int, default=0, help="0: the auto size kvserve serve takes"
    )
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    process = psutil.Process()
    before = process.memory_info().rss
    config = EngineConfig(
        model=args.model,
        max_model_len=args.ctx,
        cache=CacheConfig(kv_cache_memory_mb=args.kv_cache_memory_mb),
    )
    engine = build_engine(config, progress=False)
    caches = engine.runner.kv_caches  # per layer: [2, num_blocks, block_size, num_kv_heads, head_dim]
    num_blocks = caches[0].shape[1]
    pool_bytes = sum(c.numel() * c.element_size() for c in caches)
    idle = process.memory_info().rss
    mib = 2**20
    print(f"python + imports: {before / mib:.0f} MiB RSS")
    print(f"engine built (model, runtime, untouched pool): {idle / mib:.0f} MiB RSS")
    print(f"KV pool: {num_blocks} blocks, {pool_bytes / mib:.0f} MiB (ctx {engine.max_model_len})")
    print("| pool written | RSS (MiB) | RSS - idle (MiB) | written bytes (MiB) |")
    print("|---|---|---|---|")
    for step in range(1, args.steps + 1):
        _write_blocks(caches, num_blocks * (step - 1) // args.steps, num_blocks * step // args.steps)
        rss = process.memory_info().rss
        written = pool_bytes * step / args.steps
        print(f"| {step}/{args.steps} | {rss / mib:.0f} | {(rss - idle) / mib:.0f} | {written / mib:.0f} |")
    _write_blocks(caches, 0, num_blocks)
    rss = process.memory_info().rss
    print(f"| all again | {rss / mib:.0f} | {(rss - idle) / mib:.0f} | {pool_bytes / mib:.0f} |")


def _write_blocks(caches: list, start: int, end: int) -> None:
    for cache in caches:
        cache[:, start:end].fill_(0)  # a store faults the page in, whatever the value


if __name__ == "__main__":
    main()
