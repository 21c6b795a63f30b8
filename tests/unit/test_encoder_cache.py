"""The vision-encoder output cache: LRU by bytes, hit and miss counts, and their /metrics gauges."""

from __future__ import annotations

import torch
from prometheus_client import generate_latest

from kvserve.api.metrics import Metrics
from kvserve.engine.runner.encoder_cache import EncoderCache, EncoderCacheStats
from kvserve.serving import engine_stats


def _rows(num_rows: int) -> torch.Tensor:
    return torch.zeros(num_rows, 16)  # 64 bytes a row


def test_least_recently_used_rows_leave_first_within_the_byte_budget() -> None:
    cache = EncoderCache(capacity_bytes=10 * 64)
    cache.put("a", _rows(4))
    cache.put("b", _rows(4))
    assert cache.get("a", 4) is not None  # a is now the most recent
    cache.put("c", _rows(4))  # 12 rows > 10: b goes
    assert cache.get("b", 4) is None and cache.get("a", 4) is not None and cache.get("c", 4) is not None
    assert cache.stats() == EncoderCacheStats(num_hits=3, num_misses=1, num_entries=2, num_bytes=8 * 64)


def test_rows_larger_than_the_budget_are_not_kept_and_a_row_count_mismatch_misses() -> None:
    cache = EncoderCache(capacity_bytes=10 * 64)
    cache.put("huge", _rows(11))
    cache.put("a", _rows(4))
    assert cache.get("huge", 11) is None
    assert cache.get("a", 5) is None  # the same hash, other preprocessing: encode again
    cache.put("a", _rows(5))
    assert cache.get("a", 5) is not None and cache.stats().num_bytes == 5 * 64


def test_metrics_show_the_encoder_cache() -> None:
    stats = engine_stats.EngineStats(
        1,
        0,
        0.5,
        0.1,
        encoder_cache=engine_stats.EncoderCacheStats(num_hits=3, num_misses=2, num_entries=2, num_bytes=4096),
    )
    text = generate_latest(Metrics(lambda: stats).registry).decode()
    for line in (
        "kvserve_encoder_cache_hits 3.0",
        "kvserve_encoder_cache_misses 2.0",
        "kvserve_encoder_cache_bytes 4096.0",
    ):
        assert line in text
    text_model = generate_latest(Metrics(lambda: engine_stats.EngineStats(1, 0, 0.5, 0.1)).registry).decode()
    assert "kvserve_encoder_cache_hits 0.0" in text_model
