"""The console's disk view: checkpoints with their eviction scores, rebuilt at most once per period."""

from __future__ import annotations

from pathlib import Path

from kvserve.cli.console_sources import DiskViewCache, disk_view
from tests.unit.kvstore.kvstore_helpers import Clock, open_store, random_tokens, save


def test_disk_view_lists_checkpoints_with_scores(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(tmp_path, clock=clock)
    shared = random_tokens(32, seed=1)
    save(store, shared + random_tokens(32, seed=2), reason="cold")
    save(store, shared + random_tokens(32, seed=3), reason="continued")
    clock.now += 3600
    view = disk_view(store)
    assert view.num_checkpoints == 2 and view.num_bytes == store.stats().total_bytes
    by_reason = {c.reason: c for c in view.checkpoints}
    cold, continued = by_reason["cold"], by_reason["continued"]
    assert cold.num_tokens == continued.num_tokens == 64
    assert cold.marginal_bytes < cold.total_bytes  # the shared prefix's chunks are not its own
    # score = (effective hits + 1) x tokens / marginal bytes, x2 for an anchor (cold)
    assert cold.score == 2 * 64 / cold.marginal_bytes
    assert continued.score == 64 / continued.marginal_bytes
    store.close()


def test_disk_view_cache_rebuilds_at_most_once_per_period(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    ticks = Clock(0.0)
    cache = DiskViewCache(store, max_age_s=2.0, clock=ticks)
    assert cache.get().num_checkpoints == 0
    save(store, random_tokens(32, seed=4))
    assert cache.get().num_checkpoints == 0  # still the fresh copy
    ticks.now += 2.0
    assert cache.get().num_checkpoints == 1
    store.close()
