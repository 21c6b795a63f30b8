"""`kvserve bench cluster`: Claude-Code-shaped agents (`bench multiturn`, each with its session header)
against `kvserve cluster` on a running Ray cluster, once per router (kvserve's affinity router and
Ray's default), side by side; optionally one replica is killed after a turn. Reported per router: the
share of prompt tokens served from cache on turns >= 2, each replica's share of the sessions, the
moved sessions' first turn after the kill, and output throughput."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from kvserve.bench.datasets import Tokenizer
from kvserve.bench.multiturn import MultiturnBench, MultiturnConfig, MultiturnTarget, TurnResult

SESSION_HEADER = "X-Claude-Code-Session-Id"  # what Claude Code sends (tests/fixtures/clients)


@dataclass(frozen=True)
class RouterSummary:
    router: str
    num_turns_ok: int
    num_turns_failed: int
    cached_share_after_turn_1: float  # cached / prompt tokens over turns >= 2 (before any kill)
    # The same beyond the prefix all agents share (which every replica holds after its first turn):
    # what routing decides.
    private_cached_share: float
    session_share: dict[str, float]  # replica -> share of the sessions it served (turn 1 homes)
    num_sessions_split: int  # sessions whose turns (before any kill) went to more than one replica
    moved_cached_share: float | None  # the killed replica's sessions, the turn after the kill
    # The same past the shared prefix (which the survivor holds in RAM anyway): their own history, which
    # under an affine router the survivor never served, so what of it was cached came from the shared tier.
    moved_private_cached_share: float | None
    output_tok_per_s: float
    wall_s: float


def summarize(
    router: str, results: Sequence[TurnResult], wall_s: float, killed: str | None, shared_tokens: int = 0
) -> RouterSummary:
    """Pure: the figures of one router's run; `shared_tokens`: the prefix all agents share."""
    ok = [r for r in results if r.result.is_success]
    before = [r for r in ok if not r.is_after_restart]
    later = [r for r in before if r.turn >= 2 and r.result.cached_tokens is not None]
    homes: dict[int, set[str]] = {}
    for r in before:
        homes.setdefault(r.agent, set()).add(r.result.served_by)
    first = {r.agent: r.result.served_by for r in before if r.turn == 1}
    share = {
        tag: sum(1 for t in first.values() if t == tag) / len(first) for tag in sorted(set(first.values()))
    }
    moved_agents = {a for a, tag in first.items() if tag == killed}
    after = [r for r in ok if r.is_after_restart and r.agent in moved_agents]
    first_after = min((r.turn for r in after), default=None)
    moved = [r for r in after if r.turn == first_after and r.result.cached_tokens is not None]
    return RouterSummary(
        router=router,
        num_turns_ok=len(ok),
        num_turns_failed=len(results) - len(ok),
        cached_share_after_turn_1=_ratio(later),
        private_cached_share=_ratio(later, shared_tokens),
        session_share=share,
        num_sessions_split=sum(1 for tags in homes.values() if len(tags) > 1),
        moved_cached_share=_ratio(moved) if moved else None,
        moved_private_cached_share=_ratio(moved, shared_tokens) if moved else None,
        output_tok_per_s=sum(r.result.output_len for r in ok) / wall_s if wall_s else 0.0,
        wall_s=wall_s,
    )


def _ratio(rows: Sequence[TurnResult], skip: int = 0) -> float:
    """Cached / prompt tokens over the rows, counting only what lies past the first `skip` tokens."""
    prompt = sum(max(0, r.result.prompt_len - skip) for r in rows)
    return sum(max(0, (r.result.cached_tokens or 0) - skip) for r in rows) / prompt if prompt else 0.0


@dataclass(frozen=True)
class ClusterRun:
    address: str  # the Ray cluster (`ray start --head` ...), which the runs share
    cluster_args: tuple[str, ...]  # `kvserve cluster` flags (model, replicas, CPUs, ...)
    log: Path


def run_router(
    run: ClusterRun, router: str, tokenizer: Tokenizer, config: MultiturnConfig, progress: bool = True
) -> RouterSummary:
    """Starts `kvserve cluster --router ROUTER`, runs the agents, stops it. `{router}` in the run's
    flags becomes the router's name: each run's KV directories of its own (a shared tier that an
    earlier run filled would serve this run's prompts)."""
    killed: list[str] = []
    own_run = replace(run, cluster_args=router_flags(run.cluster_args, router))
    with cluster_app(own_run, (f"--router={router}",)) as url:
        bench = MultiturnBench(
            MultiturnTarget(url, session_header=SESSION_HEADER), tokenizer, config, progress=progress
        )
        started = time.perf_counter()
        results = bench.run(restart=_replica_killer(run.address, bench, killed))
        wall_s = time.perf_counter() - started
    return summarize(router, results, wall_s, killed[0] if killed else None, bench.text.prefix_len)


def router_flags(cluster_args: Sequence[str], router: str) -> tuple[str, ...]:
    """Pure: the flags with `{router}` replaced by the router's name."""
    return tuple(arg.replace("{router}", router) for arg in cluster_args)


@contextmanager
def cluster_app(run: ClusterRun, extra_args: Sequence[str]) -> Iterator[str]:
    """`kvserve cluster` with the run's flags and `extra_args` (later flags win), until every replica
    runs; yields its URL and stops it (SIGTERM) after."""
    port = _free_port()
    command = [sys.executable, "-m", "kvserve", "cluster", f"--address={run.address}", f"--port={port}",
               *run.cluster_args, *extra_args]  # fmt: skip
    with run.log.open("a") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, process)
        _wait_all_replicas(run.address)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()


def _replica_killer(address: str, bench: MultiturnBench, killed: list[str]) -> Callable[[], None]:
    """Kills (`ray.kill`, no clean-up: a crash) the replica that served agent 0's last turn."""

    def kill() -> None:
        import ray

        tag = next(r.result.served_by for r in reversed(bench.completed) if r.agent == 0)
        ray.init(address=address, namespace="serve", logging_level="WARNING")
        try:
            actor = next(
                a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#{tag}")
            )
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
        finally:
            ray.shutdown()
        killed.append(tag)

    return kill


def _wait_all_replicas(address: str, timeout_s: float = 600) -> None:
    """Until every replica runs: the proxy answers as soon as one does, and agents that start
    before the others are up would all be placed on it (and stay there)."""
    import ray
    from ray import serve

    ray.init(address=address, logging_level="WARNING")
    try:
        deadline = time.monotonic() + timeout_s
        while serve.status().applications["kvserve"].status != "RUNNING":
            if time.monotonic() > deadline:
                raise RuntimeError("kvserve cluster's replicas did not all start")
            time.sleep(1)
    finally:
        ray.shutdown()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"kvserve cluster exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("kvserve cluster did not start")
        time.sleep(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(summaries: Sequence[RouterSummary]) -> str:
    rows = [
        (
            "| router | turns ok / failed | cached share, turns >= 2 | of it past the shared prefix "
            "| sessions per replica | split sessions | moved sessions' next turn cached (past the shared prefix) "
            "| output tok/s | wall s |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        share = ", ".join(f"{v:.0%}" for v in s.session_share.values())
        moved = "-" if s.moved_cached_share is None else f"{s.moved_cached_share:.0%}"
        if s.moved_private_cached_share is not None:
            moved += f" ({s.moved_private_cached_share:.0%})"
        rows.append(
            f"| {s.router} | {s.num_turns_ok} / {s.num_turns_failed} | {s.cached_share_after_turn_1:.1%} "
            f"| {s.private_cached_share:.1%} "
            f"| {share} | {s.num_sessions_split} | {moved} | {s.output_tok_per_s:.1f} | {s.wall_s:.0f} |"
        )
    return "\n".join(rows)
