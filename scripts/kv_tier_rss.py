"""What the disk tier's traffic adds to a CPU server's RSS, without a model: the soak's step of ~0.7 GB
when the KV pool filled and evictions began (docs/reliability.md).

A pool shaped like SmolLM2's (30 layers, 3 KV heads of 64, bf16, 16-token blocks) is written in full
first (so its pages are already counted), then the two paths that start with evictions run as the
engine runs them:

- `evict` saves: the engine thread copies a released sequence's blocks out of the pool
  (`build_save_job`, ModelRunner.copy_blocks_out's per-layer index_select) and the writer thread
  encodes and writes its chunks (CheckpointWriter, CheckpointStore);
- disk loads: a stored run of chunks read back and verified (`load_run`) and copied into pool blocks
  (copy_blocks_in's index_copy_).

Sequences of --min-tokens to --max-tokens (the soak's: an 800-token system prompt + 50-1,200 words),
one save and one load a round, back to back (the writer's worst case: saves come faster than it
writes; those over its bounds are dropped, as the engine's are). RSS (/proc/self/statm) is sampled
every 5 ms; the figures: over the written pool at the peak, once the writer has drained, and after
glibc's malloc_trim(0) (what the allocator still held free). Run it under MALLOC_ARENA_MAX=N or other
glibc tunables to compare; `--max-pending-mb 0` leaves the writer's byte bound off (and runs against
a writer from before it).

    .venv/bin/python scripts/kv_tier_rss.py [--rounds 40] [--min-tokens 900] [--max-tokens 2600]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import torch

from kvserve.config import KVStoreConfig
from kvserve.engine.disk_saves import build_save_job, new_meta
from kvserve.kvstore.checkpoint import StoreIdentity
from kvserve.kvstore.checkpoint_store import CheckpointStore
from kvserve.kvstore.writer import CheckpointWriter

IDENTITY = StoreIdentity("rss-probe", "bfloat16", num_layers=30, num_kv_heads=3, head_dim=64, block_size=16)
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = rss()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, rss())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--min-tokens", type=int, default=900)
    parser.add_argument("--max-tokens", type=int, default=2600)
    parser.add_argument("--pool-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-pending-mb",
        type=int,
        default=KVStoreConfig.max_pending_save_mb,
        help="the writer's byte bound",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    shape = (2, args.pool_blocks, IDENTITY.block_size, IDENTITY.num_kv_heads, IDENTITY.head_dim)
    pool = [torch.randn(shape).to(torch.bfloat16) for _ in range(IDENTITY.num_layers)]

    def copy_out(block_ids: list[int]) -> list[torch.Tensor]:
        ids = torch.tensor(block_ids, dtype=torch.long)
        return [cache.index_select(1, ids).flatten(1, 2) for cache in pool]

    def copy_in(block_ids: list[int], kv: list[torch.Tensor]) -> None:
        ids = torch.tensor(block_ids, dtype=torch.long)
        for cache, layer in zip(pool, kv, strict=True):
            cache.index_copy_(1, ids, layer.reshape(2, len(block_ids), *cache.shape[2:]))

    with tempfile.TemporaryDirectory(prefix="kv-tier-rss-") as directory:
        store = CheckpointStore(Path(directory), IDENTITY, budget_bytes=2 << 30)
        bound = {"max_pending_bytes": args.max_pending_mb * MIB} if args.max_pending_mb else {}
        writer = CheckpointWriter(store, KVStoreConfig.max_pending_saves, **bound)
        saved: list[list[int]] = []  # block hashes of stored sequences
        start = rss()
        sampler = PeakSampler()
        sampler.start()
        began = time.monotonic()
        for round_ in range(args.rounds):
            num_blocks = rng.randint(args.min_tokens, args.max_tokens) // IDENTITY.block_size
            hashes = [rng.getrandbits(63) for _ in range(num_blocks)]
            token_ids = [rng.randrange(49152) for _ in range(num_blocks * IDENTITY.block_size)]
            block_ids = rng.sample(range(args.pool_blocks), num_blocks)
            meta = new_meta(store, lambda ids, r=round_: f"sequence {r}", token_ids, "evict")
            job, _ = build_save_job(store, meta, token_ids, hashes, block_ids, copy_out)
            if writer.submit(job):
                saved.append(hashes)
            if len(saved) > 6:  # a load of a sequence saved a few saves ago (written by now, mostly)
                run = store.lookup_by_block_hashes(saved[-6])
                loaded = store.load_run(run) if run is not None else None
                if loaded is not None:
                    copy_in(rng.sample(range(args.pool_blocks), loaded.num_tokens // 16), loaded.kv)
        writer.flush()
        seconds = time.monotonic() - began
        drained = rss()
        sampler.stop.set()
        sampler.join()
        trim_began = time.perf_counter()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trim_ms = (time.perf_counter() - trim_began) * 1000
        trimmed = rss()
        stats = store.stats()
        writer.close()  # (its stats stay readable)
        store.close()
    arenas = os.environ.get("MALLOC_ARENA_MAX", "default")
    print(
        f"MALLOC_ARENA_MAX={arenas}: {writer.stats.num_saved} saves ({stats.total_bytes / MIB:.0f} MiB on "
        f"disk), {writer.stats.num_dropped} dropped, {stats.num_loads} loads in {seconds:.1f} s; RSS over "
        "the touched pool: peak "
        f"{(sampler.peak - start) / MIB:+.0f} MiB, drained {(drained - start) / MIB:+.0f}, after "
        f"malloc_trim {(trimmed - start) / MIB:+.0f} (a {trim_ms:.1f} ms call)"
    )


if __name__ == "__main__":
    main()
