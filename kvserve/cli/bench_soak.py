"""`kvserve bench soak`: N streaming clients over OpenAI Chat, Responses and Anthropic Messages for a set
time, a share of them disconnecting, against a server it launches (`make serve`'s settings) or `--url`;
writes JSON + PNG and exits 1 when the verdict fails (docs/reliability.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.cli.bench_target import add_server_args, target_server

if TYPE_CHECKING:
    from rich.console import Console

    from kvserve.bench.soak import SoakRun


def register(bench_sub: argparse._SubParsersAction) -> None:
    p = bench_sub.add_parser(
        "soak",
        help="long run with disconnecting clients: 5xx, hangs, KV blocks, RSS, descriptors, TTFT drift",
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent streaming clients")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (then the drain)")
    p.add_argument("--disconnect-share", type=float, default=0.25, help="share of requests cut off")
    p.add_argument("--retry-share", type=float, default=0.5, help="share of cut requests resent as they were")
    p.add_argument(
        "--tool-share", type=float, default=0.3, help="share of conversations opening with a tool call"
    )
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    p.add_argument("--max-prompt-words", type=int, default=1200, help="longest first user message (words)")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=600, help="the shared system prompt (words)")
    p.add_argument(
        "--deadline", type=float, default=300.0, help="seconds after which a request counts as hung"
    )
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between server samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--served-model", default="smollm2", help="`model` field of the requests")
    g = add_server_args(p, "soak")
    g.add_argument("--out", type=Path, default=None, help="write NAME.json and NAME.png here")
    g.add_argument("--name", default="soak", help="file name stem of the results")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from rich.console import Console

    from kvserve.bench.soak import SoakOptions, run_soak
    from kvserve.bench.soak_client import SoakMix

    logging.getLogger("httpx").setLevel(logging.WARNING)
    console = Console(stderr=True)
    mix = SoakMix(
        disconnect_share=args.disconnect_share,
        retry_share=args.retry_share,
        tool_share=args.tool_share,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        max_prompt_words=args.max_prompt_words,
        deadline_s=args.deadline,
    )
    options = SoakOptions(
        args.clients,
        args.duration,
        mix,
        args.served_model,
        system_words=args.system_words,
        sample_every_s=args.sample_every,
        seed=args.seed,
    )
    console.print(f"soak: {args.clients} clients for {args.duration:.0f} s, {args.disconnect_share:.0%} cut")
    with target_server(args, console.print) as probe:
        soak = asyncio.run(run_soak(probe.base_url, probe, options))
    _report(args, soak, console)


def _report(args: argparse.Namespace, soak: SoakRun, console: Console) -> None:
    from kvserve.bench.soak_summary import summarize

    summary = summarize(soak)
    for check in summary.checks:
        mark = "[green]PASS[/]" if check.passed else "[red]FAIL[/]"
        console.print(f"{mark} {check.name}: {check.detail}")
    console.print(f"requests: {summary.num_requests} {summary.outcomes}; cut at {summary.cut_stages}")
    for error in summary.errors:
        console.print(f"  [yellow]{error}[/]")
    verdict = "PASS" if summary.passed else "FAIL"
    console.print(f"verdict: {verdict}")
    if args.out:
        from kvserve.bench.plots import plot_soak

        args.out.mkdir(parents=True, exist_ok=True)
        report = {
            "command": "kvserve " + " ".join(sys.argv[1:])
            if "kvserve" in sys.argv[0]
            else " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "cpus": os.cpu_count(),
            "options": {
                "clients": args.clients,
                "duration_s": args.duration,
                "mix": soak.options.mix.__dict__,
            },
            "summary": summary.to_json(),
            "samples": [asdict(s) for s in soak.samples],
        }
        json_path = args.out / f"{args.name}.json"
        json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        png = plot_soak(
            summary, soak.samples, args.out / f"{args.name}.png", f"kvserve bench soak: {verdict}"
        )
        console.print(f"wrote {json_path}, {png}")
    if not summary.passed:
        sys.exit(1)
