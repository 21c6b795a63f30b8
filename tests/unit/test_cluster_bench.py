"""The cluster benchmark's summary (pure): cached share, session spread, split and moved sessions."""

from __future__ import annotations

from kvserve.bench.cluster_bench import markdown, router_flags, summarize
from kvserve.bench.metrics import RequestResult
from kvserve.bench.multiturn import TurnResult


def _turn(agent: int, turn: int, replica: str, cached: int, after: bool = False) -> TurnResult:
    result = RequestResult(True, prompt_len=1000, output_len=10, cached_tokens=cached, served_by=replica)
    return TurnResult(agent, turn, after, result)


def test_summary_of_an_affine_run_with_a_kill() -> None:
    results = [
        _turn(0, 1, "a", 0), _turn(1, 1, "b", 0), _turn(2, 1, "a", 0), _turn(3, 1, "b", 0),
        _turn(0, 2, "a", 900), _turn(1, 2, "b", 950), _turn(2, 2, "a", 900), _turn(3, 2, "a", 100),
        _turn(0, 3, "b", 500, after=True), _turn(2, 3, "b", 700, after=True), _turn(1, 3, "b", 990, after=True),
    ]  # fmt: skip
    summary = summarize("affinity", results, wall_s=10.0, killed="a", shared_tokens=500)
    assert summary.cached_share_after_turn_1 == (900 + 950 + 900 + 100) / 4000
    assert summary.private_cached_share == (400 + 450 + 400 + 0) / 2000
    assert summary.session_share == {"a": 0.5, "b": 0.5}
    assert summary.num_sessions_split == 1  # agent 3 went to b, then a
    assert summary.moved_cached_share == (500 + 700) / 2000  # agents 0 and 2 lived on a
    assert summary.moved_private_cached_share == (0 + 200) / 1000
    assert summary.output_tok_per_s == 11 * 10 / 10.0
    assert "| affinity | 11 / 0 | 71.2% | 62.5% | 50%, 50% | 1 | 60% (20%) |" in markdown([summary])


def test_each_router_gets_kv_directories_of_its_own() -> None:
    flags = ("--kv-shared-dir", "/tmp/kv/{router}/shared", "--no-kv-cache-preload")
    assert router_flags(flags, "ray") == ("--kv-shared-dir", "/tmp/kv/ray/shared", "--no-kv-cache-preload")
