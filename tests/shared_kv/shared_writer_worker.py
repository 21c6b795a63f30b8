"""One of several processes that hammer a shared KV tier with saves of overlapping prefixes (and load
what the others wrote): `python -m tests.shared_kv.shared_writer_worker LOCATION ENDPOINT LOCAL SEED N`.
Exits 1 if anything it loaded was not exactly the KV of its tokens."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.shared.open_store import open_object_store
from kvserve.kvstore.shared.tier import SharedTier
from tests.unit.kvstore.kvstore_helpers import (
    CHUNK_TOKENS,
    FINGERPRINT,
    bits,
    kv_for,
    make_identity,
    open_store,
    random_tokens,
    save,
)

BASE = random_tokens(256, seed=0)  # every worker's prefixes start with this


def main(location: str, endpoint: str, local: str, seed: int, num_saves: int) -> int:
    identity = make_identity()
    store = open_object_store(location, endpoint or None)
    tier = SharedTier(store, identity, chunk_tokens=CHUNK_TOKENS, miss_refresh_s=0.0, background=False)
    checkpoints = open_store(Path(local))
    rng = random.Random(seed)
    num_loaded = 0
    for i in range(num_saves):
        tokens = BASE[: rng.randrange(4, 65) * 4]
        if rng.random() < 0.5:
            tokens = tokens + random_tokens(rng.randrange(1, 9) * 4, seed=seed * 1000 + i)
        result = save(checkpoints, tokens)
        if result.status == "stored":
            tier.publish_now(checkpoints, result.checkpoint_id)
        # Load the longest shared run of another prefix of the base: whatever is found must be exact.
        probe = BASE[: rng.randrange(4, 65) * 4]
        hashes = compute_block_hashes(probe, identity.block_size, FINGERPRINT)
        run = tier.lookup_by_block_hashes(hashes, want_tokens=len(probe))
        if run is None:
            continue
        loaded = tier.load_run(run)
        if loaded is None:
            print(f"worker {seed}: a run it found could not be loaded", file=sys.stderr)
            return 1
        expected = kv_for(probe[: run.num_tokens], identity)
        same = all(bits(a).equal(bits(b)) for a, b in zip(loaded.kv, expected, strict=True))
        if list(loaded.token_ids) != probe[: run.num_tokens] or not same:
            print(f"worker {seed}: loaded KV differs from its tokens' KV", file=sys.stderr)
            return 1
        num_loaded += 1
    print(f"worker {seed}: {num_saves} saves, {num_loaded} verified loads, {tier.stats()}")
    return 0


if __name__ == "__main__":
    location, endpoint, local, seed, num_saves = sys.argv[1:]
    sys.exit(main(location, endpoint, local, int(seed), int(num_saves)))
