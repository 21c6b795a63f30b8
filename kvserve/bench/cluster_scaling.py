"""`kvserve bench cluster-scaling`: the same agents against `kvserve cluster` with one replica, then
with two (one per node), on one Ray cluster; output throughput of each and the ratio (issue 36: two
replicas on two nodes give >= 1.7x one).

On one machine (`scripts/cluster_bench_two_nodes.py scaling`) each replica's process is pinned to a
core of its own (`--pin-cores`, all its threads; it runs one torch thread), so one replica has one
core and two have two. The rest (Ray's processes, the proxy, the ingress, this client) is left to the
OS: with one replica it mostly runs on the idle core, with two it takes its share from both, so the
ratio is, if anything, understated. `--confine-to-nodes` confines all of it to the replicas' cores in
each run instead: one replica's cluster gets one core (as on a one-core machine), two get two. Each run reports every replica's CPU use (1.0: a core busy all
along, i.e. saturated), this client's and the whole machine's, so a run on a busy host shows it.

Before the timed part each replica prefills the agents' shared prefix once (one warm-up session per
replica), so both runs start from the same cache state; EOS is suppressed so every turn produces
its output tokens."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvserve.bench.cluster_bench import SESSION_HEADER, ClusterRun, cluster_app, summarize
from kvserve.bench.datasets import BenchTokenizer, Tokenizer
from kvserve.bench.multiturn import MultiturnBench, MultiturnConfig, MultiturnTarget, TurnResult
from kvserve.bench.process_tree import process_tree


@dataclass(frozen=True)
class ScalingRow:
    num_replicas: int
    num_turns_ok: int
    num_turns_failed: int
    num_output_tokens: int
    wall_s: float
    output_tok_per_s: float
    cached_share_after_turn_1: float  # cached / prompt tokens over turns >= 2: no run thrashed its pool
    session_share: dict[str, float]  # replica -> share of the agents it served
    replica_cores: dict[str, int]  # replica -> the core its process was pinned to ({}: not pinned)
    replica_cpu_use: dict[str, float]  # replica -> its CPU seconds / wall (1.0: one core busy throughout)
    client_cpu_use: float  # this benchmark client's CPU seconds / wall
    # Ray's own processes on this host (GCS, raylets, proxies, the ingress, the driver), replicas aside:
    # what relaying the tokens and running the cluster cost, out of the replicas' cores.
    ray_cpu_use: float
    machine_cpu_use: float  # busy cores of the whole host over the run (Ray, the client, anyone else)


@dataclass(frozen=True)
class ScalingSummary:
    rows: tuple[ScalingRow, ...]
    speedup: float  # the last row's output tok/s over the first's


def scaling_row(
    num_replicas: int,
    results: Sequence[TurnResult],
    wall_s: float,
    cores: dict[str, int],
    cpu_s: dict[str, float],
    client_cpu_s: float,
    ray_cpu_s: float,
    machine_cpu_s: float,
) -> ScalingRow:
    """Pure: one replica count's figures from its turns and the CPU seconds spent during them."""
    base = summarize(f"{num_replicas} replicas", results, wall_s, None)
    return ScalingRow(
        num_replicas=num_replicas,
        num_turns_ok=base.num_turns_ok,
        num_turns_failed=base.num_turns_failed,
        num_output_tokens=sum(r.result.output_len for r in results if r.result.is_success),
        wall_s=wall_s,
        output_tok_per_s=base.output_tok_per_s,
        cached_share_after_turn_1=base.cached_share_after_turn_1,
        session_share=base.session_share,
        replica_cores=dict(cores),
        replica_cpu_use={tag: s / wall_s for tag, s in cpu_s.items()},
        client_cpu_use=client_cpu_s / wall_s,
        ray_cpu_use=ray_cpu_s / wall_s,
        machine_cpu_use=machine_cpu_s / wall_s,
    )


def speedup(rows: Sequence[ScalingRow]) -> float:
    return rows[-1].output_tok_per_s / rows[0].output_tok_per_s if rows[0].output_tok_per_s else 0.0


def run_replicas(
    run: ClusterRun,
    num_replicas: int,
    bench_tokenizer: BenchTokenizer,
    config: MultiturnConfig,
    pin_cores: Sequence[int] = (),
    progress: bool = True,
    confine: bool = False,
) -> ScalingRow:
    """`kvserve cluster --replicas N` (one per node), warmed, pinned, then the agents, timed.
    `confine`: the cluster's other processes and this client too, on the replicas' cores (each node a
    machine of one core), given back every core afterwards."""
    extra = (f"--replicas={num_replicas}", "--max-replicas-per-node=1", "--router=affinity")
    with cluster_app(run, extra) as url:
        tokenizer = bench_tokenizer.tokenizer
        target = MultiturnTarget(
            url, session_header=SESSION_HEADER, logit_bias=bench_tokenizer.suppress_stop_bias()
        )
        _warm_every_replica(target, tokenizer, config, num_replicas)
        pids = replica_pids(url, num_replicas)
        cores = {tag: pin_cores[i] for i, tag in enumerate(sorted(pids))} if pin_cores else {}
        for tag, core in cores.items():
            pin_process(pids[tag], core)
        bench = MultiturnBench(target, tokenizer, replace(config, restart_after_turn=None), progress=progress)
        ray_pids = cluster_process_ids(run.address) - set(pids.values())
        confined = [*ray_pids, os.getpid()] if confine and cores else []
        for pid in confined:
            pin_process(pid, *cores.values())
        cpu_before = {tag: process_cpu_s(pid) for tag, pid in pids.items()}
        client_before, ray_before, machine_before = _own_cpu_s(), cpu_by_pid(ray_pids), machine_busy_s()
        started = time.perf_counter()
        results = bench.run()
        wall_s = time.perf_counter() - started
        cpu_s = {tag: process_cpu_s(pid) - cpu_before[tag] for tag, pid in pids.items()}
        client_s, machine_s = _own_cpu_s() - client_before, machine_busy_s() - machine_before
        ray_s = cpu_spent(ray_before, cpu_by_pid(ray_pids))
        for pid in confined:  # the Ray nodes outlive this run: the next one starts unconfined
            pin_process(pid, *range(os.cpu_count() or 1))
    return scaling_row(num_replicas, results, wall_s, cores, cpu_s, client_s, ray_s, machine_s)


def _warm_every_replica(
    target: MultiturnTarget, tokenizer: Tokenizer, config: MultiturnConfig, num_replicas: int
) -> None:
    """One short first turn per replica (new sessions spread over the least loaded), so that each
    has prefilled the shared prefix before the timed part; again until every replica served one."""
    served: set[str] = set()
    for attempt in range(1, 6):
        warm = replace(
            config, num_agents=num_replicas, num_turns=1, output_tokens=2, restart_after_turn=None,
            seed=config.seed + 1000 * attempt,
        )  # fmt: skip
        results = MultiturnBench(target, tokenizer, warm, progress=False).run()
        failed = [r.result.error for r in results if not r.result.is_success]
        if failed:
            raise RuntimeError(f"warm-up request failed: {failed[0]}")
        served |= {r.result.served_by for r in results}
        if len(served) >= num_replicas:
            return
    raise RuntimeError(f"warm-up reached {len(served)} of {num_replicas} replicas")


def replica_pids(url: str, num_replicas: int, timeout_s: float = 60) -> dict[str, int]:
    """Replica tag -> process id, from the cluster's /metrics (`kvserve_replica_info`, which the
    replicas publish every 2 s once the router runs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = parse_replica_pids(httpx.get(f"{url}/metrics", timeout=10).text)
        if len(pids) >= num_replicas:
            return pids
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics names {len(pids)} of {num_replicas} replicas")
        time.sleep(1)


def parse_replica_pids(metrics_text: str) -> dict[str, int]:
    """Pure: `kvserve_replica_info{replica, pid}` of a /metrics page."""
    return {
        sample.labels["replica"]: int(sample.labels["pid"])
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "kvserve_replica_info"
        for sample in family.samples
    }


def pin_process(pid: int, *cores: int) -> None:
    """Every thread of `pid` onto `cores` (threads it starts later inherit their creator's mask)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return  # the process ended meanwhile
    for task in tasks:
        try:
            os.sched_setaffinity(int(task.name), set(cores))
        except (ProcessLookupError, OSError):
            pass  # a thread that ended meanwhile


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cluster_process_ids(address: str) -> set[int]:
    """The Ray cluster's processes on this host: those whose command line names its GCS port (GCS,
    raylets, monitors, `kvserve cluster`, which is a Ray driver) and everything they started (the
    workers: replicas, proxies, the ingress, the controller); this process and its parents aside
    (the client names the address too)."""
    port = address.rsplit(":", 1)[1]
    marks = (f":{port}", f"={port}")
    return process_tree(lambda args: any(arg.endswith(mark) for arg in args for mark in marks))


def cpu_by_pid(pids: set[int]) -> dict[int, float]:
    """CPU seconds of each of `pids` still running."""
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = process_cpu_s(pid)
        except (OSError, IndexError):
            pass  # ended meanwhile
    return seconds


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """Pure: CPU seconds spent between two readings by the processes in both."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


def machine_busy_s() -> float:
    """CPU seconds the whole host spent busy so far, summed over its cores (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def markdown(summary: ScalingSummary) -> str:
    rows = [
        (
            "| replicas | turns ok / failed | output tokens | wall s | output tok/s | cached share, turns >= 2 "
            "| sessions per replica | replica CPU use (cores) | client CPU use | Ray's CPU use | host CPU use |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.rows:
        share = ", ".join(f"{v:.0%}" for v in r.session_share.values())
        cpu = ", ".join(
            f"{use:.2f}" + (f" (core {r.replica_cores[tag]})" if tag in r.replica_cores else "")
            for tag, use in sorted(r.replica_cpu_use.items())
        )
        rows.append(
            f"| {r.num_replicas} | {r.num_turns_ok} / {r.num_turns_failed} | {r.num_output_tokens} "
            f"| {r.wall_s:.0f} | {r.output_tok_per_s:.1f} | {r.cached_share_after_turn_1:.1%} | {share} "
            f"| {cpu} | {r.client_cpu_use:.2f} | {r.ray_cpu_use:.2f} | {r.machine_cpu_use:.2f} |"
        )
    rows.append(f"\n{summary.rows[-1].num_replicas} replicas / 1: {summary.speedup:.2f}x the output tok/s")
    return "\n".join(rows)
