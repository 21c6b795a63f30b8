"""The scaling benchmark's pure parts: a replica count's row, the ratio, the replicas' pids on /metrics,
and the CPU readings it takes from /proc."""

from __future__ import annotations

import os
import subprocess
import time

from kvserve.bench.cluster_scaling import (
    ScalingSummary,
    cluster_process_ids,
    cpu_spent,
    machine_busy_s,
    markdown,
    parse_replica_pids,
    process_cpu_s,
    scaling_row,
    speedup,
)
from kvserve.bench.metrics import RequestResult
from kvserve.bench.multiturn import TurnResult
from kvserve.cluster import board
from kvserve.cluster.cluster_metrics import render_metrics
from kvserve.cluster.replica_stats import ReplicaStats


def _turn(agent: int, turn: int, replica: str, ok: bool = True) -> TurnResult:
    result = RequestResult(
        ok, prompt_len=1000, output_len=100 if ok else 0, cached_tokens=800, served_by=replica
    )
    return TurnResult(agent, turn, False, result)


def test_rows_and_the_ratio() -> None:
    one = scaling_row(
        1, [_turn(a, t, "a") for a in range(4) for t in (1, 2)], wall_s=20.0,
        cores={"a": 0}, cpu_s={"a": 19.0}, client_cpu_s=1.0, ray_cpu_s=2.0, machine_cpu_s=30.0,
    )  # fmt: skip
    two = scaling_row(
        2, [_turn(a, t, "ab"[a % 2], ok=a != 3 or t == 1) for a in range(4) for t in (1, 2)], wall_s=10.0,
        cores={"a": 0, "b": 1}, cpu_s={"a": 9.5, "b": 9.0}, client_cpu_s=0.5, ray_cpu_s=2.0, machine_cpu_s=20.0,
    )  # fmt: skip
    assert (one.num_turns_ok, one.num_output_tokens, one.output_tok_per_s) == (8, 800, 40.0)
    assert (two.num_turns_ok, two.num_turns_failed, two.num_output_tokens) == (7, 1, 700)
    assert two.session_share == {"a": 0.5, "b": 0.5}
    assert two.replica_cpu_use == {"a": 0.95, "b": 0.9} and two.client_cpu_use == 0.05
    assert one.machine_cpu_use == 1.5 and (one.ray_cpu_use, two.ray_cpu_use) == (0.1, 0.2)
    summary = ScalingSummary((one, two), speedup([one, two]))
    assert summary.speedup == 70.0 / 40.0
    table = markdown(summary)
    assert (
        "| 2 | 7 / 1 | 700 | 10 | 70.0 | 80.0% | 50%, 50% | 0.95 (core 0), 0.90 (core 1) | 0.05 | 0.20 | 2.00 |"
        in table
    )
    assert "2 replicas / 1: 1.75x" in table


def test_replica_pids_from_the_clusters_metrics() -> None:
    source = board.RoutingBoard()
    stats = {t: ReplicaStats(tag=t, pid=pid, node_id=f"n{t}") for t, pid in (("a", 101), ("b", 202))}
    source.set_replicas(stats, {}, time.time())
    assert parse_replica_pids(render_metrics(source).decode()) == {"a": 101, "b": 202}
    assert parse_replica_pids("") == {}


def test_cpu_readings_grow_with_work() -> None:
    own, machine = process_cpu_s(os.getpid()), machine_busy_s()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) - own >= 0.2
    assert machine_busy_s() - machine >= 0.2


def test_the_clusters_processes_are_those_naming_its_port_and_their_children() -> None:
    # Stand-ins: a "raylet" naming the GCS address, with a "worker" child; and a process that does not.
    raylet = subprocess.Popen(["sh", "-c", "sleep 30 & wait", "raylet", "--gcs-address=10.0.0.1:54321"])
    other = subprocess.Popen(["sh", "-c", "sleep 30", "other", "--port=5432"])
    try:
        deadline = time.monotonic() + 10
        while not (found := cluster_process_ids("127.0.0.1:54321")) - {raylet.pid}:
            assert time.monotonic() < deadline, "the child never showed"
            time.sleep(0.05)
        assert raylet.pid in found and other.pid not in found and os.getpid() not in found
        assert all(pid == raylet.pid or _parent(pid) == raylet.pid for pid in found)
    finally:
        for process in (raylet, other):
            process.kill()
            process.wait()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_cpu_spent_counts_processes_read_both_times() -> None:
    assert cpu_spent({1: 1.0, 2: 5.0, 3: 2.0}, {1: 3.0, 3: 2.5, 4: 9.0}) == 2.5
