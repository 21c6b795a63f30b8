"""`kvserve bench cluster`: agents against `kvserve cluster` under each router, side by side;
`kvserve bench cluster-scaling`: the same agents against one replica, then two."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.bench.cluster_bench import ClusterRun
    from kvserve.bench.multiturn import MultiturnConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster",
        help="Claude-Code-shaped agents against kvserve cluster: kvserve's router vs Ray's default",
        description=__doc__,
    )
    _add_common_args(
        p,
        "--replicas 2 --max-replicas-per-node 1 --num-cpus-per-replica 1 --no-kv-cache",
        "kvserve cluster flags for both runs (model, replicas, CPUs, KV); `{router}` in them becomes "
        "the run's router, e.g. --kv-shared-dir /tmp/kv/{router}: each run's KV directories of its own",
    )
    p.add_argument("--routers", default="affinity,ray", help="comma-separated: affinity, ray")
    _add_agent_args(p, agents=8, turns=6, prefix_tokens=12_000)
    p.add_argument("--kill-after", type=int, default=None, help="kill a replica after this turn")
    p.set_defaults(func=run)
    register_scaling(sub)


def register_scaling(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster-scaling",
        help="the same agents against kvserve cluster with 1 replica, then 2 (one per node): output tok/s",
        description="kvserve/bench/cluster_scaling.py's docstring says what is measured and how",
    )
    _add_common_args(
        p,
        "--num-cpus-per-replica 1 --no-kv-cache --max-num-seqs 8",
        "kvserve cluster flags for every run (model, CPUs, KV); --replicas is this command's",
    )
    p.add_argument("--replica-counts", default="1,2", help="comma-separated, the first is the baseline")
    p.add_argument(
        "--pin-cores",
        default="",
        help="comma-separated cores, one per replica (this host's Ray cluster only): each replica's "
        "process on its own core; default: not pinned",
    )
    p.add_argument(
        "--confine-to-nodes",
        action="store_true",
        help="with --pin-cores: each run's whole cluster (Ray's processes, the proxy, the ingress, this "
        "client) on the cores its replicas have, as if each node were a machine of one core; without it "
        "Ray's own work runs on the idle core of the one-replica run for free",
    )
    _add_agent_args(p, agents=16, turns=4, prefix_tokens=2_000)
    p.set_defaults(func=run_scaling)


def _add_common_args(p: argparse.ArgumentParser, cluster_args: str, cluster_help: str) -> None:
    p.add_argument("--address", required=True, help="a running Ray cluster (docs/cluster.md)")
    p.add_argument("--cluster-args", default=cluster_args, help=cluster_help)
    p.add_argument("--model", default="smollm2", help="the served model's tokenizer (prompts are cut by it)")
    p.add_argument("--log", type=Path, default=Path("cluster-bench.log"), help="the clusters' output")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here")


def _add_agent_args(p: argparse.ArgumentParser, agents: int, turns: int, prefix_tokens: int) -> None:
    p.add_argument("--agents", type=int, default=agents, help="concurrent agents (closed loop)")
    p.add_argument("--turns", type=int, default=turns)
    p.add_argument(
        "--prefix-tokens", type=int, default=prefix_tokens, help="the system + tools prefix all share"
    )
    p.add_argument("--user-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=100)


def _agents_and_cluster(
    args: argparse.Namespace, kill_after: int | None
) -> tuple[MultiturnConfig, ClusterRun]:
    from kvserve.bench.cluster_bench import ClusterRun
    from kvserve.bench.multiturn import MultiturnConfig

    config = MultiturnConfig(
        num_agents=args.agents,
        num_turns=args.turns,
        prefix_tokens=args.prefix_tokens,
        user_tokens=args.user_tokens,
        output_tokens=args.output_tokens,
        restart_after_turn=kill_after,
    )
    return config, ClusterRun(
        args.address, ("--model", args.model, *shlex.split(args.cluster_args)), args.log
    )


def run_scaling(args: argparse.Namespace) -> None:
    from kvserve.bench.cluster_scaling import ScalingSummary, markdown, run_replicas, speedup
    from kvserve.bench.datasets import load_tokenizer

    config, run_spec = _agents_and_cluster(args, kill_after=None)
    cores = [int(c) for c in args.pin_cores.split(",") if c.strip()]
    counts = [int(n) for n in args.replica_counts.split(",")]
    if cores and len(cores) < max(counts):
        raise SystemExit(f"--pin-cores names {len(cores)} cores for up to {max(counts)} replicas")
    tokenizer = load_tokenizer(args.model)
    if args.confine_to_nodes and not cores:
        raise SystemExit("--confine-to-nodes needs --pin-cores")
    rows = tuple(
        run_replicas(run_spec, n, tokenizer, config, cores, confine=args.confine_to_nodes) for n in counts
    )
    summary = ScalingSummary(rows, speedup(rows))
    print(markdown(summary))
    if args.json:
        # With the command line that produced it (the flags are the run's whole configuration).
        args.json.write_text(json.dumps({"argv": sys.argv, **asdict(summary)}, indent=2) + "\n")


def run(args: argparse.Namespace) -> None:
    from kvserve.bench.cluster_bench import markdown, run_router
    from kvserve.bench.datasets import load_tokenizer

    config, run_spec = _agents_and_cluster(args, kill_after=args.kill_after)
    tokenizer = load_tokenizer(args.model).tokenizer
    summaries = [run_router(run_spec, router, tokenizer, config) for router in args.routers.split(",")]
    print(markdown(summaries))
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
