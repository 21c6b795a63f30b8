"""The cluster's /metrics from the router's board: vLLM's names per replica, the cluster hit rate."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvserve.cluster.board import RoutingBoard
from kvserve.cluster.cluster_metrics import render_metrics
from kvserve.cluster.replica_stats import ReplicaStats


def _samples(board: RoutingBoard) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render_metrics(board).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_per_replica_and_cluster_figures() -> None:
    board = RoutingBoard()
    a = ReplicaStats(
        "a", pid=11, node_id="n1", num_running=2, num_prompt_tokens=1000, num_cached_prompt_tokens=900
    )
    b = ReplicaStats(
        "b", pid=12, node_id="n2", num_waiting=1, num_prompt_tokens=1000, num_cached_prompt_tokens=100
    )
    board.set_replicas({"a": a, "b": b}, {"a": 2}, now=0.0, sessions={"a": 3, "b": 1})
    board.count_decision("session", "a")
    board.count_decision("session", "a")
    board.count_decision("least_loaded", "b")
    samples = _samples(board)
    assert samples[("vllm:num_requests_running", (("replica", "a"),))] == 2
    assert samples[("vllm:num_requests_waiting", (("replica", "b"),))] == 1
    assert samples[("vllm:prefix_cache_hits_total", (("replica", "a"),))] == 900
    assert samples[("kvserve_prefix_cache_hit_rate", (("replica", "all"),))] == 0.5
    assert samples[("kvserve_router_decisions_total", (("reason", "session"), ("replica", "a")))] == 2
    assert samples[("kvserve_replica_info", (("node_id", "n2"), ("pid", "12"), ("replica", "b")))] == 1
    assert samples[("kvserve_router_requests_in_flight", (("replica", "b"),))] == 0
    assert samples[("kvserve_router_sessions", (("replica", "a"),))] == 3
    board.set_replicas({"a": a, "b": b}, {}, now=1.0)  # sessions not counted this time: the last counts stay
    assert _samples(board)[("kvserve_router_sessions", (("replica", "b"),))] == 1


def test_replica_stats_round_trip_and_ignore_rays_default() -> None:
    stats = ReplicaStats("a", pid=1, num_disk_hit_tokens=5)
    assert ReplicaStats.from_dict({**stats.to_dict(), "from_a_newer_replica": 1}) == stats
    assert ReplicaStats.from_dict({}) is None


def test_the_board_knows_how_long_it_has_had_no_replica() -> None:
    board = RoutingBoard()
    assert board.seconds_without_replicas(100.0) == 0.0  # the router has not spoken yet
    board.set_replicas({}, {}, now=10.0)
    board.set_replicas({}, {}, now=20.0)
    assert board.seconds_without_replicas(45.0) == 35.0
    board.set_replicas({"a": ReplicaStats("a")}, {}, now=50.0)
    assert board.seconds_without_replicas(60.0) == 0.0
