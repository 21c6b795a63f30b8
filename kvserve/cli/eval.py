"""`kvserve eval`: capability regression suites, graded automatically, against the embedded engine
or any OpenAI-compatible server (`--url`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvserve.cli.serve import add_serve_args
from kvserve.eval.cases import SUITES, CaseFilter

if TYPE_CHECKING:
    from kvserve.eval.eval_case import EvalCase
    from kvserve.eval.result import CaseResult
    from kvserve.eval.runner import EvalRunner, RunSettings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="run the eval suites (core, humaneval, tools, smoke) and grade them")
    g = p.add_argument_group("eval")
    g.add_argument("--suite", default="core", help=f"comma-separated: {', '.join(SUITES)} (default core)")
    g.add_argument("--case-id", action="append", default=[], help="only this case (repeatable)")
    g.add_argument("--domain", action="append", default=[], help="only this domain (repeatable)")
    g.add_argument("--source", action="append", default=[], help="only this source (repeatable)")
    g.add_argument("--limit", type=_positive, help="only the first N cases of each suite")
    g.add_argument("--list-cases", action="store_true", help="list the selected cases and exit")
    g.add_argument("--validate-cases", action="store_true", help="check every built-in case and exit")
    g.add_argument("--self-test-extractors", action="store_true", help="run the model-free extractor cases")
    g.add_argument("--regrade", metavar="TRACE", help="re-grade the PASSED/FAILED cases of a trace file")
    g.add_argument("--url", help="evaluate this server instead of starting the engine in-process")
    g.add_argument("--plain", action="store_true", help="no TUI: one line per case (default without a TTY)")
    g.add_argument(
        "--trace",
        metavar="PATH",
        help="write every case (prompt, output, grade) as JSONL here (with --regrade: the re-graded cases)",
    )
    g.add_argument("--json", metavar="PATH", help="write the summary as JSON here ('-' for stdout)")
    g.add_argument("--parallel", type=_positive, default=4, help="requests in flight (default 4)")
    g.add_argument("--retries", type=int, default=1, help="extra attempts for ERROR/INCOMPLETE cases")
    g.add_argument("--max-tokens", type=_positive, help="override every case's token budget")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    g.add_argument("--sample-seed", type=int, help="per-request sampling seed")
    g.add_argument(
        "--think", choices=["auto", "on", "off"], default="auto", help="thinking (auto: server default)"
    )
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    g.add_argument("--code-timeout", type=float, default=10.0, help="seconds per code test run")
    add_serve_args(p)
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def run(args: argparse.Namespace) -> None:
    from kvserve.eval.cases import load_cases, select, validate
    from kvserve.eval.eval_case import CaseError
    from kvserve.eval.selftest import EXTRACTOR_CASES, run_self_test

    if args.self_test_extractors:
        failures = run_self_test()
        print("\n".join(failures) or f"extractors: all {len(EXTRACTOR_CASES)} cases pass")
        sys.exit(1 if failures else 0)
    if args.regrade:
        sys.exit(_regrade(Path(args.regrade), args))
    try:
        cases = load_cases()
    except CaseError as error:
        sys.exit(f"kvserve eval: {error}")
    if args.validate_cases:
        problems = validate(cases)
        print("\n".join(problems) or f"cases: all {len(cases)} valid")
        sys.exit(1 if problems else 0)
    suites = tuple(s.strip() for s in args.suite.split(",") if s.strip())
    if unknown := set(suites) - set(SUITES):
        sys.exit(
            f"kvserve eval: unknown suite {', '.join(sorted(unknown))} (choose from {', '.join(SUITES)})"
        )
    wanted = CaseFilter(suites, tuple(args.case_id), tuple(args.domain), tuple(args.source), args.limit)
    chosen = select(cases, wanted)
    if not chosen:
        sys.exit("kvserve eval: no case matches the filters")
    if args.list_cases:
        for case in chosen:
            print(
                f"{case.id:<28} {case.kind.value:<10} {case.domain:<11} {case.source:<14} {','.join(case.suites)}"
            )
        return
    sys.exit(_evaluate(chosen, suites, args))


def _evaluate(cases: list[EvalCase], suites: tuple[str, ...], args: argparse.Namespace) -> int:
    from kvserve.eval.client import EvalClient, RequestFailed
    from kvserve.eval.grade import CaseStatus
    from kvserve.eval.runner import EvalRunner
    from kvserve.eval.trace import TraceWriter

    started, wall_start = datetime.now(UTC), time.monotonic()
    meta: dict[str, Any] = {"suites": list(suites), "url": args.url or "embedded"}
    meta |= {"started": started.isoformat(timespec="seconds"), "parallel": args.parallel}
    meta |= {"temperature": args.temperature, "think": args.think, "retries": args.retries}
    with _server_url(args) as url:
        runner = EvalRunner(EvalClient(url, args.api_key, args.timeout), cases, _run_settings(args))
        trace = TraceWriter(Path(args.trace), meta) if args.trace else None
        if trace:
            runner.on_finish = trace.write
        try:
            results, is_interrupted = _drive(runner, args.plain)
        except RequestFailed as error:  # the server is unreachable or refuses /v1/models
            print(f"kvserve eval: {url}: {error}", file=sys.stderr)
            return 2
        finally:
            meta |= {"model": runner.model, "wall_s": round(time.monotonic() - wall_start, 1)}
            if trace:
                trace.close({"model": runner.model, "wall_s": meta["wall_s"]})
    _report(results, suites, meta, args.json)
    if is_interrupted:
        return 130
    # Wrong answers are scores, not failures; requests that failed mean the run itself is broken.
    return 1 if any(r.status is CaseStatus.ERROR for r in results) else 0


def _run_settings(args: argparse.Namespace) -> RunSettings:
    from kvserve.eval.client import ChatSettings
    from kvserve.eval.runner import RunSettings
    from kvserve.eval.sandbox import SandboxLimits

    effort = {"auto": None, "on": "high", "off": "none"}[args.think]
    return RunSettings(
        chat=ChatSettings(args.temperature, args.sample_seed, effort),
        parallel=args.parallel,
        retries=max(args.retries, 0),
        max_tokens=args.max_tokens,
        sandbox=SandboxLimits(timeout_s=args.code_timeout),
    )


def _drive(runner: EvalRunner, is_plain: bool) -> tuple[list[CaseResult], bool]:
    """Runs the cases under the TUI, or plainly without a terminal; returns (results, interrupted)."""
    from rich.console import Console

    from kvserve.eval.plain import run_plain
    from kvserve.eval.tui import run_tui

    if is_plain or not (sys.stdin.isatty() and sys.stdout.isatty()):
        try:
            return asyncio.run(run_plain(runner)), False
        except KeyboardInterrupt:  # Ctrl-C: report what finished (the rest is stopped or pending)
            return runner.results(), True
    return run_tui(runner, Console()), False


@contextlib.contextmanager
def _server_url(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url
        return
    from kvserve.cli.embedded import embedded_server

    with embedded_server(embedded_args(args)) as url:
        yield url


def embedded_args(args: argparse.Namespace) -> argparse.Namespace:
    """The embedded engine's flags: no disk KV tier unless --kv-cache-dir names one. A regression
    run must not depend on what earlier runs left on disk (bf16 greedy output after a disk hit can
    differ from a cold prefill's), and suites should not fill the user's default cache."""
    if args.kv_cache_dir is not None:
        return args
    return argparse.Namespace(**(vars(args) | {"no_kv_cache": True}))


def _report(
    results: list[CaseResult], suites: tuple[str, ...], meta: dict[str, Any], json_path: str | None
) -> None:
    from kvserve.eval.report import render_report, summarize, summary_json

    summary = summarize(results, suites)
    print(f"\nmodel {meta.get('model', '?')}  wall {meta.get('wall_s', '?')}s\n{render_report(summary)}")
    if json_path:
        text = json.dumps(summary_json(summary, meta), indent=2)
        if json_path == "-":
            print(text)
        else:
            Path(json_path).write_text(text + "\n", encoding="utf-8")


def _regrade(path: Path, args: argparse.Namespace) -> int:
    from kvserve.eval.sandbox import SandboxLimits
    from kvserve.eval.trace import TraceWriter, read_trace, regrade

    try:
        header, results = read_trace(path)
    except (OSError, ValueError) as error:
        print(f"kvserve eval: --regrade {path}: {error}", file=sys.stderr)
        return 2
    outcome = regrade(results, SandboxLimits(timeout_s=args.code_timeout))
    for change in outcome.changes:
        print(
            f"changed {change.case_id}: {change.before.value} -> {change.after.value}"
            f" ({change.extracted_before[:40]!r} -> {change.extracted_after[:40]!r})"
        )
    graded = len(results) - outcome.num_not_graded
    print(f"regraded {graded} cases: changed={len(outcome.changes)} not_graded={outcome.num_not_graded}")
    if args.trace:  # the same outputs under today's grades: a new baseline that re-grades unchanged
        writer = TraceWriter(Path(args.trace), {**header, "regraded_from": str(path)})
        for result in outcome.results:
            writer.write(result)
        writer.close()
    suites = tuple(header.get("suites") or sorted({s for r in results for s in r.case.suites}))
    _report(outcome.results, suites, {**header, "regraded_from": str(path)}, args.json)
    return 0
