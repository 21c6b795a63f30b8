"""The three workloads behind one small interface, so one runner drives any of them on any target."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.table import Table

from kvserve.bench import plots, report
from kvserve.bench.client import Api, warm_up
from kvserve.bench.context_sweep import ContextPoint, run_context_sweep
from kvserve.bench.datasets import (
    BenchRequest,
    BenchTokenizer,
    prefix_repetition_dataset,
    random_dataset,
    sharegpt_dataset,
)
from kvserve.bench.metrics import SLO, BenchMetrics, compute_metrics, parse_slo
from kvserve.bench.multiturn import (
    MultiturnBench,
    MultiturnConfig,
    MultiturnTarget,
    TurnResult,
    summarize_turns,
)
from kvserve.bench.serve_bench import LoadShape, ServeTarget, run_serve_bench_sharded
from kvserve.bench.targets import Target

Restart = Callable[[], float] | None
logger = logging.getLogger(__name__)


class Workload(Protocol):
    default_name: str

    def run(self, target: Target, url: str, restart: Restart) -> Any: ...

    def table(self, results: dict[str, Any]) -> Table: ...

    def write(self, results: dict[str, Any], out: Path, stem: str) -> list[Path]: ...

    def summary(self, results: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Common:
    model: str
    api: Api
    served_model: str | None
    logit_bias: dict[str, float] | None
    progress: bool
    ignore_eos: bool = False  # EOS suppressed by the request's `ignore_eos` field instead (serve only)


def make(args: argparse.Namespace, tokenizer: BenchTokenizer) -> Workload:
    """The workload the parsed flags ask for; ValueError on inconsistent flags."""
    common = Common(
        args.model,
        Api(args.api),
        args.served_model,
        None if args.keep_eos or args.ignore_eos else tokenizer.suppress_stop_bias(),
        not args.no_progress,
        ignore_eos=args.ignore_eos and not args.keep_eos,
    )
    if args.workload == "serve":
        return ServeWorkload(common, _dataset(args, tokenizer), _shape(args), parse_slo(args.goodput))
    if args.workload == "multiturn":
        if common.api is Api.COMPLETIONS:
            raise ValueError("bench multiturn sends conversations: use --api chat or --api anthropic")
        config = MultiturnConfig(
            num_agents=args.agents,
            num_turns=args.turns,
            prefix_tokens=args.prefix_tokens,
            user_tokens=args.user_tokens,
            output_tokens=args.output_tokens,
            restart_after_turn=args.restart_after,
            session_rate=args.session_rate,
            think_time_s=args.think_time,
            seed=args.seed,
            fixture=args.fixture,
            image_turns=args.image_turns,
            image_size=args.image_size,
        )
        return MultiturnWorkload(common, tokenizer, config)
    if common.api is not Api.COMPLETIONS:
        raise ValueError("bench context extends one raw prompt: it drives --api completions only")
    frontiers = [int(x) for x in args.frontiers.split(",") if x.strip()]
    return ContextWorkload(common, tokenizer, frontiers, args.decode_tokens, args.fixture)


def _dataset(args: argparse.Namespace, tokenizer: BenchTokenizer) -> list[BenchRequest]:
    tok = tokenizer.tokenizer
    if args.dataset == "random":
        return random_dataset(
            tok, args.num_prompts, args.input_len, args.output_len, args.range_ratio, args.seed
        )
    if args.dataset == "prefix-repetition":
        return prefix_repetition_dataset(
            tok,
            args.num_prompts,
            args.prefix_len,
            args.suffix_len,
            args.num_prefixes,
            args.output_len,
            args.seed,
        )
    if args.dataset_path is None:
        raise ValueError("--dataset sharegpt-file needs --dataset-path")
    return sharegpt_dataset(tok, args.dataset_path, args.num_prompts, args.output_len, seed=args.seed)


def _shape(args: argparse.Namespace) -> LoadShape:
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if args.client_procs < 1:
        raise ValueError("--client-procs must be >= 1")
    return LoadShape(args.request_rate, args.burstiness, args.max_concurrency, args.seed, args.client_procs)


def _warm_up(common: Common, url: str) -> None:
    result = asyncio.run(warm_up(url, common.served_model, common.api))
    if not result.is_success:
        logger.warning("warm-up request to %s failed: %s", url, result.error)


class ServeWorkload:
    def __init__(self, common: Common, requests: list[BenchRequest], shape: LoadShape, slo: SLO | None):
        self.common, self.requests, self.shape, self.slo = common, requests, shape, slo
        rate = "inf" if math.isinf(shape.request_rate) else f"{shape.request_rate:g}"
        concurrency = f"-c{shape.max_concurrency}" if shape.max_concurrency else ""
        self.default_name = f"serve-{_slug(common.model)}{concurrency}-r{rate}"

    def run(self, target: Target, url: str, restart: Restart) -> BenchMetrics:
        _warm_up(self.common, url)
        serve_target = ServeTarget(
            url,
            self.common.api,
            self.common.served_model,
            target.rules,
            self.common.logit_bias,
            self.common.ignore_eos,
        )
        results, duration = run_serve_bench_sharded(
            serve_target, self.requests, self.shape, self.common.progress
        )
        return compute_metrics(results, duration, self.slo)

    def table(self, results: dict[str, BenchMetrics]) -> Table:
        return report.serve_table(results, f"bench serve ({self.common.model}, {len(self.requests)} prompts)")

    def write(self, results: dict[str, BenchMetrics], out: Path, stem: str) -> list[Path]:
        rows = [{"server": label, **m.flat()} for label, m in results.items()]
        return [
            report.write_csv(out / f"{stem}.csv", rows),
            plots.plot_serve(results, out / f"{stem}.png", f"bench serve: {self.common.model}, {stem}"),
        ]

    def summary(self, results: dict[str, BenchMetrics]) -> dict[str, Any]:
        return {label: {**m.flat(), "errors": list(m.errors[:5])} for label, m in results.items()}


class MultiturnWorkload:
    def __init__(self, common: Common, tokenizer: BenchTokenizer, config: MultiturnConfig):
        self.common, self.tokenizer, self.config = common, tokenizer, config
        self.default_name = f"multiturn-{_slug(common.model)}-a{config.num_agents}"

    def run(self, target: Target, url: str, restart: Restart) -> list[TurnResult]:
        _warm_up(self.common, url)
        mt_target = MultiturnTarget(
            url, self.common.served_model, self.common.api, target.rules, self.common.logit_bias
        )
        bench = MultiturnBench(mt_target, self.tokenizer.tokenizer, self.config, self.common.progress)
        if restart is None and self.config.restart_after_turn:
            logger.warning(
                "--restart-after ignored for %s: only servers the benchmark launched restart", target.label
            )

        def restart_and_warm() -> None:
            assert restart is not None
            restart()
            _warm_up(self.common, url)

        return bench.run(restart_and_warm if restart is not None else None)

    def table(self, results: dict[str, list[TurnResult]]) -> Table:
        c = self.config
        title = (
            f"bench multiturn ({self.common.model}, {c.num_agents} agents, prefix {c.prefix_tokens} tokens)"
        )
        return report.multiturn_table({k: summarize_turns(v) for k, v in results.items()}, title)

    def write(self, results: dict[str, list[TurnResult]], out: Path, stem: str) -> list[Path]:
        rows = [row for label, rs in results.items() for row in report.multiturn_rows(label, rs)]
        summaries = {k: summarize_turns(v) for k, v in results.items()}
        title = f"bench multiturn: {self.common.model}, prefix {self.config.prefix_tokens} tok, {self.config.num_agents} agent(s)"
        return [
            report.write_csv(out / f"{stem}.csv", rows),
            plots.plot_multiturn(summaries, out / f"{stem}.png", title, self.config.restart_after_turn),
        ]

    def summary(self, results: dict[str, list[TurnResult]]) -> dict[str, Any]:
        return {k: [s.__dict__ for s in summarize_turns(v)] for k, v in results.items()}


class ContextWorkload:
    def __init__(
        self,
        common: Common,
        tokenizer: BenchTokenizer,
        frontiers: list[int],
        decode_tokens: int,
        fixture: Path,
    ):
        self.common, self.tokenizer, self.fixture = common, tokenizer, fixture
        self.frontiers, self.decode_tokens = frontiers, decode_tokens
        self.default_name = f"context-{_slug(common.model)}"

    def run(self, target: Target, url: str, restart: Restart) -> list[ContextPoint]:
        _warm_up(self.common, url)
        return asyncio.run(
            run_context_sweep(
                url,
                self.tokenizer.tokenizer,
                self.frontiers,
                self.decode_tokens,
                model=self.common.served_model,
                rules=target.rules,
                logit_bias=self.common.logit_bias,
                progress=self.common.progress,
                fixture=self.fixture,
            )
        )

    def table(self, results: dict[str, list[ContextPoint]]) -> Table:
        return report.context_table(
            results, f"bench context ({self.common.model}, {self.decode_tokens} decode tokens)"
        )

    def write(self, results: dict[str, list[ContextPoint]], out: Path, stem: str) -> list[Path]:
        rows = [{"server": label, **p.row()} for label, points in results.items() for p in points]
        return [
            report.write_csv(out / f"{stem}.csv", rows),
            plots.plot_context(results, out / f"{stem}.png", f"bench context: {self.common.model}"),
        ]

    def summary(self, results: dict[str, list[ContextPoint]]) -> dict[str, Any]:
        return {k: [p.row() for p in v] for k, v in results.items()}


def _slug(model: str) -> str:
    return Path(model).stem.replace(".", "-")
