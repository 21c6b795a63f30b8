"""`kvserve bench cluster`: agents against `kvserve cluster` under each router, side by side."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import asdict
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster",
        help="Claude-Code-shaped agents against kvserve cluster: kvserve's router vs Ray's default",
        description=__doc__,
    )
    p.add_argument("--address", required=True, help="a running Ray cluster (docs/cluster.md)")
    p.add_argument(
        "--cluster-args",
        default="--replicas 2 --max-replicas-per-node 1 --num-cpus-per-replica 1 --no-kv-cache",
        help="kvserve cluster flags for both runs (model, replicas, CPUs, KV)",
    )
    p.add_argument("--routers", default="affinity,ray", help="comma-separated: affinity, ray")
    p.add_argument("--model", default="smollm2", help="the served model's tokenizer (prompts are cut by it)")
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--prefix-tokens", type=int, default=12_000, help="the system + tools prefix all share")
    p.add_argument("--user-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=100)
    p.add_argument("--kill-after", type=int, default=None, help="kill a replica after this turn")
    p.add_argument("--log", type=Path, default=Path("cluster-bench.log"), help="the clusters' output")
    p.add_argument("--json", type=Path, default=None, help="also write the summaries here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from kvserve.bench.cluster_bench import ClusterRun, markdown, run_router
    from kvserve.bench.datasets import load_tokenizer
    from kvserve.bench.multiturn import MultiturnConfig

    config = MultiturnConfig(
        num_agents=args.agents,
        num_turns=args.turns,
        prefix_tokens=args.prefix_tokens,
        user_tokens=args.user_tokens,
        output_tokens=args.output_tokens,
        restart_after_turn=args.kill_after,
    )
    cluster_args = ("--model", args.model, *shlex.split(args.cluster_args))
    run_spec = ClusterRun(args.address, cluster_args, args.log)
    tokenizer = load_tokenizer(args.model).tokenizer
    summaries = [run_router(run_spec, router, tokenizer, config) for router in args.routers.split(",")]
    print(markdown(summaries))
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
