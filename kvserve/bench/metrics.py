"""Serving-benchmark metrics from per-request timestamps: pure math, vLLM `benchmark_serving` definitions.

- TTFT: request start → first chunk that carries generated text.
- ITL: gaps between consecutive content chunks of one request (all requests pooled).
- TPOT: (E2EL − TTFT) / (output_len − 1) per request with output_len > 1 (0 for goodput otherwise).
- E2EL: request start → last content chunk.
- throughput: completed requests, output tokens and input + output tokens per second of wall time.
- goodput: requests per second that met every given SLO (TTFT, TPOT, E2EL, in ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

PERCENTILES = (90.0, 99.0)  # beside mean and median


@dataclass(frozen=True)
class RequestResult:
    """One request as the client saw it; times in seconds relative to its own start."""

    is_success: bool
    prompt_len: int  # tokens: the server's usage when given, else the dataset's count
    output_len: int  # tokens: the server's usage when given, else the number of content chunks
    ttft: float = 0.0
    itl: tuple[float, ...] = ()
    latency: float = 0.0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, None if not reported
    error: str = ""
    generated_text: str = ""
    served_by: str = ""  # the replica that answered, where the server says (`kvserve cluster`)

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; 0 for one-token outputs (vLLM's convention)."""
        if self.output_len <= 1:
            return 0.0
        return (self.latency - self.ttft) / (self.output_len - 1)


class Stats(NamedTuple):
    """mean / median / std and the PERCENTILES of one latency metric, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]

    @property
    def p90(self) -> float:
        return self.percentiles[90.0]

    @property
    def p99(self) -> float:
        return self.percentiles[99.0]


@dataclass(frozen=True)
class SLO:
    """Per-request service-level objectives in ms; None = not checked."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def is_empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None

    def is_met(self, result: RequestResult) -> bool:
        checks = ((self.ttft_ms, result.ttft), (self.tpot_ms, result.tpot), (self.e2el_ms, result.latency))
        return all(limit is None or value * 1000.0 <= limit for limit, value in checks)


@dataclass(frozen=True)
class BenchMetrics:
    duration_s: float
    num_completed: int
    num_failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # req/s
    request_goodput: float | None  # req/s meeting the SLO; None without an SLO
    output_throughput: float  # tok/s
    total_token_throughput: float  # (input + output) tok/s
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2el_ms: Stats
    errors: tuple[str, ...] = field(default=())

    def flat(self) -> dict[str, float | int | None]:
        """One row for CSV/JSON: scalars plus mean/median/p90/p99 of every latency metric."""
        row: dict[str, float | int | None] = {
            "duration_s": self.duration_s,
            "completed": self.num_completed,
            "failed": self.num_failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            stats: Stats = getattr(self, f"{name}_ms")
            row[f"mean_{name}_ms"] = stats.mean
            row[f"median_{name}_ms"] = stats.median
            for p, value in stats.percentiles.items():
                row[f"p{p:g}_{name}_ms"] = value
        return row


def stats_ms(values_s: list[float] | tuple[float, ...]) -> Stats:
    """Stats of seconds, reported in ms; an empty list gives zeros (as vLLM's `np.mean(x or 0)`)."""
    data = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000.0
    return Stats(
        mean=float(np.mean(data)),
        median=float(np.median(data)),
        std=float(np.std(data)),
        percentiles={p: float(np.percentile(data, p)) for p in PERCENTILES},
    )


def compute_metrics(results: list[RequestResult], duration_s: float, slo: SLO | None = None) -> BenchMetrics:
    """Aggregate successful requests; failed ones count only in `num_failed` (and `errors`)."""
    assert duration_s > 0, "a benchmark takes time"
    ok = [r for r in results if r.is_success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    goodput = None
    if slo is not None and not slo.is_empty:
        goodput = sum(1 for r in ok if slo.is_met(r)) / duration_s
    return BenchMetrics(
        duration_s=duration_s,
        num_completed=len(ok),
        num_failed=len(results) - len(ok),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / duration_s,
        request_goodput=goodput,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        ttft_ms=stats_ms([r.ttft for r in ok]),
        tpot_ms=stats_ms([r.tpot for r in ok if r.output_len > 1]),
        itl_ms=stats_ms([gap for r in ok for gap in r.itl]),
        e2el_ms=stats_ms([r.latency for r in ok]),
        errors=tuple(r.error for r in results if not r.is_success),
    )


def parse_slo(items: list[str] | None) -> SLO | None:
    """`["ttft:500", "tpot:50"]` (ms, vLLM's `--goodput` syntax) → SLO; ValueError on bad input."""
    if not items:
        return None
    limits: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"goodput SLO must be ttft:MS, tpot:MS or e2el:MS, got {item!r}")
        ms = float(value)
        if not ms > 0:
            raise ValueError(f"goodput SLO must be a positive number of ms, got {item!r}")
        limits[f"{name}_ms"] = ms
    return SLO(**limits)
