"""`kvserve bench serve | multiturn | context | compare`: serving benchmarks over HTTP.

Each workload runs against `--url` (any OpenAI/Anthropic-compatible server) or against servers it
launches itself (`--targets`, default: kvserve alone); `bench compare <workload>` is the same run with
kvserve and llama-server side by side and results written into docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from kvserve.bench.endpoints import Api


def register(bench_sub: argparse._SubParsersAction) -> None:
    for name, add_args, help_text in _WORKLOADS:
        p = bench_sub.add_parser(name, help=help_text)
        add_args(p)
        _add_target_args(p, default_targets="kvserve", default_out=None)
        p.set_defaults(func=run_workload, workload=name)
    c = bench_sub.add_parser(
        "compare", help="run one workload against kvserve and llama-server, write docs/benchmarks/"
    )
    compare_sub = c.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    for name, add_args, help_text in _WORKLOADS:
        p = compare_sub.add_parser(name, help=help_text)
        add_args(p)
        _add_target_args(p, default_targets=_COMPARE_TARGETS[name], default_out=Path("docs/benchmarks"))
        p.set_defaults(func=run_workload, workload=name)


def _add_common(p: argparse.ArgumentParser, default_api: str) -> None:
    p.add_argument(
        "--model", "-m", default="smollm2", help="model alias/GGUF: the launched servers' and the tokenizer's"
    )
    p.add_argument("--api", default=default_api, choices=[a.value for a in Api], help="endpoint to drive")
    p.add_argument("--served-model", default=None, help="`model` field of the requests (default: none)")
    p.add_argument(
        "--keep-eos",
        action="store_true",
        help="let the model stop early (default: EOS suppressed by logit_bias)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="suppress EOS with the request's `ignore_eos: true` (kvserve's and vLLM's field) instead of "
        "logit_bias: the engine then sees plain greedy requests, as `bench engine` runs them (bench serve)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    _add_common(p, "completions")
    p.add_argument("--dataset", default="random", choices=["random", "prefix-repetition", "sharegpt-file"])
    p.add_argument(
        "--dataset-path", type=Path, default=None, help="ShareGPT JSON file (--dataset sharegpt-file)"
    )
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    p.add_argument(
        "--output-len", type=int, default=128, help="output tokens (sharegpt: default = the reply's)"
    )
    p.add_argument("--range-ratio", type=float, default=0.0, help="random: lengths vary by ±ratio")
    p.add_argument("--prefix-len", type=int, default=512, help="prefix-repetition: shared prefix tokens")
    p.add_argument("--suffix-len", type=int, default=128, help="prefix-repetition: per-prompt suffix tokens")
    p.add_argument("--num-prefixes", type=int, default=4, help="prefix-repetition: distinct prefixes")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape of the gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument(
        "--client-procs",
        "--client-processes",
        dest="client_procs",
        type=int,
        default=1,
        help="client processes sharing the load, results merged (a fast server outruns one Python "
        "client: each process's CPU share is printed, with a warning when one was saturated)",
    )
    p.add_argument(
        "--goodput", nargs="*", default=None, metavar="KEY:MS", help="SLOs: ttft:MS tpot:MS e2el:MS"
    )


def _add_multiturn_args(p: argparse.ArgumentParser) -> None:
    _add_common(p, "chat")
    p.add_argument("--agents", type=int, default=1, help="concurrent simulated agents")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--prefix-tokens", type=int, default=12_000, help="shared system + tools prefix")
    p.add_argument("--user-tokens", type=int, default=200, help="tokens of each user / tool-result turn")
    p.add_argument("--output-tokens", type=int, default=100, help="generated tokens per turn")
    p.add_argument("--restart-after", type=int, default=None, help="restart launched servers after this turn")
    p.add_argument(
        "--session-rate", type=float, default=None, help="Poisson agent arrivals/s (default: closed loop)"
    )
    p.add_argument("--think-time", type=float, default=0.0, help="seconds an agent waits between turns")
    p.add_argument(
        "--image-turns",
        type=_turn_list,
        default=(),
        metavar="N,M",
        help="turns whose user message opens with a synthetic screenshot, resent with the history "
        "(e.g. 1,3; default: none, text only)",
    )
    p.add_argument(
        "--image-size", type=_image_size, default=(1920, 1080), metavar="WxH", help="screenshot size"
    )
    _add_fixture(p)


def _turn_list(text: str) -> tuple[int, ...]:
    try:
        turns = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated turn numbers, got {text!r}") from None
    if any(t < 1 for t in turns):
        raise argparse.ArgumentTypeError("turns are numbered from 1")
    return turns


def _image_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 1920x1080, got {text!r}")
    return int(width), int(height)


def _add_context_args(p: argparse.ArgumentParser) -> None:
    _add_common(p, "completions")
    p.add_argument("--frontiers", default="1024,2048,4096,7936", help="comma-separated context lengths")
    p.add_argument("--decode-tokens", type=int, default=64)
    _add_fixture(p)


def _add_fixture(p: argparse.ArgumentParser) -> None:
    from kvserve.bench.datasets import CLAUDE_CODE_FIXTURE

    p.add_argument(
        "--fixture",
        type=Path,
        default=CLAUDE_CODE_FIXTURE,
        help="Anthropic Messages request whose system + tools make the prompt text (default: Claude Code's)",
    )


def _add_target_args(p: argparse.ArgumentParser, default_targets: str, default_out: Path | None) -> None:
    g = p.add_argument_group("servers")
    g.add_argument("--url", default=None, help="benchmark this running server instead of launching any")
    g.add_argument(
        "--targets",
        default=default_targets,
        help="launched servers: kvserve, kvserve-disk, kvserve-no-kv-cache, llama-server (C++), "
        "llama-cpp-python",
    )
    g.add_argument("--ctx", type=int, default=0, help="context length of launched servers (0 = the model's)")
    g.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads of each launched server"
    )
    g.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="concurrent sequences of launched servers (llama-server: slots, default 1; it gets --ctx × N)",
    )
    g.add_argument("--kvserve-args", default="", help="extra `kvserve serve` flags, one shell-quoted string")
    g.add_argument(
        "--llama-args", default="", help="extra flags of the llama.cpp peers (llama-server, llama_cpp.server)"
    )
    g.add_argument("--out", type=Path, default=default_out, help="write CSV, PNG and JSON here")
    g.add_argument("--name", default=None, help="file name stem of the results (default from the workload)")
    g.add_argument("--log-dir", type=Path, default=None, help="launched servers' logs (default: a temp dir)")


_COMPARE_TARGETS = {
    "serve": "kvserve,llama-server",
    "multiturn": "kvserve-disk,kvserve-no-kv-cache,llama-server",
    "context": "kvserve,llama-server",
}

_WORKLOADS = (
    ("serve", _add_serve_args, "load test: TTFT, ITL, TPOT, E2EL, throughput, goodput"),
    ("multiturn", _add_multiturn_args, "simulated agents over a shared prefix, optional restart"),
    ("context", _add_context_args, "prefill/decode throughput as the context grows"),
)


def run_workload(args: argparse.Namespace) -> None:
    from rich.console import Console

    from kvserve.bench import workloads
    from kvserve.bench.datasets import load_tokenizer
    from kvserve.bench.targets import LaunchOptions, Target, launch_targets, running, unavailable_reason

    console = Console(stderr=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the bars
    try:
        if args.url:
            targets = [Target("url", url=args.url)]
        else:
            options = LaunchOptions(
                args.model, args.ctx, args.threads, args.parallel, args.kvserve_args, args.llama_args
            )
            targets = launch_targets([t.strip() for t in args.targets.split(",") if t.strip()], options)
        tokenizer = load_tokenizer(args.model)
        workload = workloads.make(args, tokenizer)
    except ValueError as error:
        sys.exit(f"kvserve bench: {error}")
    results: dict[str, Any] = {}
    for target in targets:
        reason = unavailable_reason(target)
        if reason:
            console.print(f"[yellow]skipping {target.label}: {reason}[/]")
            continue
        console.print(f"[bold]{args.workload}[/] → {target.label}")
        try:
            with running(target, args.log_dir) as (url, restart):
                results[target.label] = workload.run(target, url, restart)
        except RuntimeError as error:  # a launched server that died or never came up
            console.print(f"[red]{target.label} failed: {error}[/]")
    if not results:
        sys.exit("kvserve bench: no target produced results")
    Console().print(workload.table(results))
    if args.out:
        _write_outputs(args, workload, results, console)


def _write_outputs(args: argparse.Namespace, workload: Any, results: dict[str, Any], console: Any) -> None:
    stem = args.name or workload.default_name
    paths = workload.write(results, args.out, stem)
    meta = {
        "command": "kvserve " + " ".join(sys.argv[1:])
        if sys.argv and "kvserve" in sys.argv[0]
        else " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": _cpu_model(),
        "cpus": os.cpu_count(),
        "summary": workload.summary(results),
    }
    paths.append(args.out / f"{stem}.json")
    paths[-1].write_text(json.dumps(meta, indent=2, default=str) + "\n")
    for path in paths:
        console.print(f"wrote {path}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
