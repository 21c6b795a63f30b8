"""The crash harness's ledger (scripts/crash_harness.py) reads what a real CheckpointStore logs: the
ids it reports stored and not since evicted or superseded are exactly the ones on disk. A changed
log line would make the harness blind; this test would then fail."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
from kvstore_helpers import Provider, kv_for, open_store, random_tokens, text_of

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import CheckpointMeta
from kvserve.kvstore.writer import CheckpointWriter, SaveJob

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "crash_harness.py"


def load_harness():
    spec = importlib.util.spec_from_file_location("crash_harness", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_ledger_follows_stores_evictions_and_supersessions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvserve.kvstore")
    store = open_store(tmp_path)
    writer = CheckpointWriter(store)
    identity = store.identity
    previous = None
    for seed in range(8):
        tokens = random_tokens(40, seed)
        meta = CheckpointMeta.new(identity, text_of(tokens), 40, "agent_session")
        hashes = compute_block_hashes(tokens, identity.block_size, identity.fingerprint)
        job = SaveJob(meta, tokens, hashes, Provider(kv_for(tokens, identity)), supersedes=previous)
        writer.submit(job, block=True)
        writer.flush()
        if seed == 0:  # room for two or three: later saves evict
            store.budget_bytes = int(store.stats().total_bytes * 2.5)
        previous = meta.checkpoint_id if seed % 3 else None  # some turns supersede the last
    writer.close()
    lines = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records)
    ledger = load_harness().Ledger()
    ledger.read(lines)
    assert ledger.num_evicted >= 1 and ledger.num_superseded >= 1, lines
    assert set(ledger.live) == {c.checkpoint_id for c in store.checkpoints()}
    assert ledger.corrupt == []


def test_the_ledger_reads_the_writer_queue_from_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--evictions tells which save a kill cut from the log: the queued line of each save (written
    before its outcome) and the outcome naming its id, or a later one's (first in, first out)."""
    caplog.set_level(logging.INFO, logger="kvserve.kvstore")
    store = open_store(tmp_path)
    writer = CheckpointWriter(store)
    metas = []
    for seed, reason in enumerate(("cold", "evict", "evict")):
        tokens = random_tokens(40, seed)
        metas.append(CheckpointMeta.new(store.identity, text_of(tokens), 40, reason))  # type: ignore[arg-type]
        hashes = compute_block_hashes(tokens, store.identity.block_size, store.identity.fingerprint)
        writer.submit(
            SaveJob(metas[-1], tokens, hashes, Provider(kv_for(tokens, store.identity))), block=True
        )
    writer.close()
    lines = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records]
    ledger = load_harness().Ledger()
    ledger.read("\n".join(lines))
    assert ledger.queued_by_reason == {"cold": 1, "evict": 2} and ledger.pending == [], lines

    a, b, c = (m.checkpoint_id for m in metas)
    ledger = load_harness().Ledger()
    queued = [line for line in lines if "queued" in line]
    ledger.read(
        "\n".join([*queued, f"INFO x: kvstore: evicting checkpoint {'f' * 40} (over the 1 MiB budget)"])
    )
    assert ledger.pending == [(a, "cold"), (b, "evict"), (c, "evict")] and ledger.deleting == ["f" * 40]
    ledger.read(f"INFO x: kvstore: checkpoint {b} not stored: exists")  # a's outcome went unlogged
    assert ledger.pending == [(c, "evict")] and ledger.deleting == []
    ledger.new_life()
    assert ledger.pending == []
