"""`kvserve bench hostile`: slow readers, slowloris heads, connection churn, oversized heads and bodies,
invalid UTF-8 in every string field and deep JSON nesting against a server it launches (`make serve`'s
settings) or `--url`; prints the counts, writes JSON, exits 1 when the verdict fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from kvserve.cli.bench_target import add_server_args, target_server


def register(bench_sub: argparse._SubParsersAction) -> None:
    p = bench_sub.add_parser(
        "hostile", help="hostile clients: only 4xx or closed connections, bounded memory"
    )
    p.add_argument("--connections", type=int, default=10_000, help="connections opened and dropped")
    p.add_argument(
        "--slowloris", type=int, default=256, help="connections sending their head a byte a second"
    )
    p.add_argument("--slow-readers", type=int, default=16, help="streams whose client never reads")
    p.add_argument("--slow-reader-hold", type=float, default=20.0, help="seconds a slow reader holds on")
    p.add_argument("--max-body-mb", type=int, default=64, help="the server's --max-body-mb")
    g = add_server_args(p, "attack")
    g.add_argument("--json", type=Path, default=None, help="write the results here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    import logging

    from rich.console import Console
    from rich.table import Table

    from kvserve.bench.hostile import CaseResult
    from kvserve.bench.hostile_run import HostileOptions, run_hostile

    logging.getLogger("httpx").setLevel(logging.WARNING)
    console = Console(stderr=True)
    options = HostileOptions(
        num_connections=args.connections,
        num_slowloris=args.slowloris,
        num_slow_readers=args.slow_readers,
        slow_reader_hold_s=args.slow_reader_hold,
        max_body_bytes=args.max_body_mb * 2**20,
    )

    def on_case(case: CaseResult) -> None:
        answers = ", ".join(f"{k}: {n}" for k, n in sorted(case.answers.items()))
        console.print(f"{case.name}: {case.num_tried} tried in {case.seconds:.1f} s: {answers}")

    with target_server(args, console.print, ("--max-body-mb", str(args.max_body_mb))) as probe:
        report = asyncio.run(run_hostile(probe.base_url, probe, options, on_case))
    table = Table("case", "tried", "answers", "seconds", title="kvserve bench hostile")
    for case in report.cases:
        answers = ", ".join(f"{k}: {n}" for k, n in sorted(case.answers.items()))
        table.add_row(case.name, str(case.num_tried), answers, f"{case.seconds:.1f}")
    Console().print(table)
    for name, ok, detail in report.checks:
        console.print(f"{'[green]PASS[/]' if ok else '[red]FAIL[/]'} {name}: {detail}")
    console.print(f"verdict: {'PASS' if report.passed else 'FAIL'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "command": "kvserve " + " ".join(sys.argv[1:])
            if "kvserve" in sys.argv[0]
            else " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "cpus": os.cpu_count(),
            "cases": [c.to_json() for c in report.cases],
            "rss_idle": None if report.idle.process is None else report.idle.process.rss_bytes,
            "rss_max": report.rss_max,
            "rss_after": None if report.after.process is None else report.after.process.rss_bytes,
            # The pool's written bytes explain part of any RSS growth: accepted requests write KV.
            "pool_touched_bytes_after": None
            if report.after.pool is None
            else report.after.pool.num_touched_blocks * report.after.pool.block_bytes,
            "checks": [{"name": n, "passed": ok, "detail": d} for n, ok, d in report.checks],
            "passed": report.passed,
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if not report.passed:
        sys.exit(1)
