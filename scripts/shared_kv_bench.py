"""How long the shared KV tier takes to publish and to load a checkpoint, beside the local disk tier,
with SmolLM2's KV layout (30 layers, 3 KV heads of 64, float16: 22.5 KiB a token) and random KV.

    python scripts/shared_kv_bench.py --shared /mnt/nfs/kv-bench            # a shared directory
    python scripts/shared_kv_bench.py --shared s3://kvserve-kv/bench --endpoint http://127.0.0.1:8333

Prints one JSON line per size: local save / load, shared publish / cold load (a second replica's
first read: listing + chunks + verification), in seconds. Figures: docs/shared-kv.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan, StoreIdentity
from kvserve.kvstore.checkpoint_store import CheckpointStore
from kvserve.kvstore.shared.open_store import open_object_store
from kvserve.kvstore.shared.tier import SharedTier

IDENTITY = StoreIdentity("bench:smollm2-layout", "float16", 30, 3, 64, 16)


def run(num_tokens: int, shared: str, endpoint: str | None, work: Path, seed: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 49152, (num_tokens,), generator=generator).tolist()
    kv = [torch.randn(2, num_tokens, 3, 64, generator=generator).half() for _ in range(30)]
    hashes = compute_block_hashes(tokens, 16, IDENTITY.fingerprint)
    local = CheckpointStore(work / f"local-{seed}", IDENTITY, 1 << 40)
    meta = CheckpointMeta.new(IDENTITY, f"bench {seed} {num_tokens}", num_tokens, "cold")

    def provider(span: ChunkSpan) -> list[torch.Tensor]:
        return [layer[:, span.start : span.end] for layer in kv]

    started = time.perf_counter()
    assert local.save(meta, tokens, hashes, provider).status == "stored"
    save_s = time.perf_counter() - started
    started = time.perf_counter()
    assert local.load(meta.checkpoint_id) is not None
    local_load_s = time.perf_counter() - started

    writer = SharedTier(open_object_store(shared, endpoint), IDENTITY, background=False)
    started = time.perf_counter()
    assert writer.publish_now(local, meta.checkpoint_id)
    publish_s = time.perf_counter() - started

    started = time.perf_counter()
    reader = SharedTier(open_object_store(shared, endpoint), IDENTITY, background=False)  # lists
    run_ = reader.lookup_by_block_hashes(hashes)
    loaded = reader.load_run(run_) if run_ is not None else None
    shared_load_s = time.perf_counter() - started
    assert loaded is not None and loaded.num_tokens == num_tokens
    local.close()
    return {
        "tokens": num_tokens,
        "mib": round(num_tokens * IDENTITY.bytes_per_token / 2**20, 1),
        "local_save_s": round(save_s, 3),
        "local_load_s": round(local_load_s, 3),
        "shared_publish_s": round(publish_s, 3),
        "shared_cold_load_s": round(shared_load_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", required=True, help="a directory or s3://bucket/prefix")
    parser.add_argument("--endpoint", default=None, help="S3-compatible server URL")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kv-bench-") as work:
        for seed, num_tokens in enumerate(args.tokens):
            print(json.dumps(run(num_tokens, args.shared, args.endpoint, Path(work), seed)), flush=True)


if __name__ == "__main__":
    main()
