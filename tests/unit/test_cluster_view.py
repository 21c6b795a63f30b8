"""The console's cluster page (`/kvserve/v1/cluster`) from the router's board: per replica and totals."""

from __future__ import annotations

import json

from kvserve.cluster.board import RoutingBoard
from kvserve.cluster.board_routes import board_response
from kvserve.cluster.cluster_view import CLUSTER_PATH, cluster_view
from kvserve.cluster.replica_stats import ReplicaStats


def test_replicas_and_totals() -> None:
    board = RoutingBoard()
    a = ReplicaStats(
        "a", pid=11, node_id="n1", num_running=2, num_prompt_tokens=1000, num_cached_prompt_tokens=900
    )
    b = ReplicaStats(
        "b", pid=12, node_id="n2", num_waiting=1, kv_usage=0.25, num_prompt_tokens=3000,
        num_cached_prompt_tokens=1500, num_disk_hit_tokens=700, num_generation_tokens=40,
    )  # fmt: skip
    board.set_replicas({"b": b, "a": a}, {"a": 2}, now=0.0, sessions={"a": 3, "b": 1})
    for reason, tag in [("session", "a"), ("session", "a"), ("least_loaded", "b"), ("prefix", "gone")]:
        board.count_decision(reason, tag)
    view = cluster_view(board.snapshot())
    assert [r.replica for r in view.replicas] == ["a", "b"]
    first, second = view.replicas
    assert (first.hit_rate, first.num_requests_in_flight, first.num_sessions, first.decisions) == (
        0.9,
        2,
        3,
        {"session": 2},
    )
    assert (second.node_id, second.pid, second.num_waiting, second.kv_usage) == ("n2", 12, 1, 0.25)
    assert (second.num_disk_hit_tokens, second.num_generation_tokens, second.hit_rate) == (700, 40, 0.5)
    assert view.num_replicas == 2 and view.hit_rate == 2400 / 4000
    assert (view.num_requests_in_flight, view.num_sessions) == (2, 4)
    # A replica that is gone keeps its decisions in the totals (as /metrics' counters do).
    assert view.decisions == {"session": 2, "prefix": 1, "least_loaded": 1}


def test_an_empty_board() -> None:
    view = cluster_view(RoutingBoard().snapshot())
    assert (view.num_replicas, view.hit_rate, view.decisions, view.replicas) == (0, 0.0, {}, [])


def test_the_ingress_answers_its_board_routes_behind_the_key() -> None:
    board = RoutingBoard()
    board.set_replicas(
        {"a": ReplicaStats("a", num_prompt_tokens=10, num_cached_prompt_tokens=5)}, {}, now=0.0
    )
    keyed = [(b"authorization", b"Bearer k")]
    page = board_response("GET", CLUSTER_PATH, keyed, "k", board)
    assert page is not None and page.status_code == 200
    assert json.loads(page.body)["hit_rate"] == 0.5
    metrics = board_response("GET", "/metrics", keyed, "k", board)
    assert metrics is not None and b"kvserve_replica_info" in metrics.body
    refused = board_response("GET", CLUSTER_PATH, [], "k", board)
    assert refused is not None and refused.status_code == 401
    # Everything else goes to a replica: the console page, its other routes, a POST to the path.
    for method, path in [("GET", "/"), ("GET", "/kvserve/v1/cache"), ("POST", CLUSTER_PATH)]:
        assert board_response(method, path, keyed, "k", board) is None
