"""A soak run's figures and verdict (pure: records and samples in, plain data out).

The verdict's checks are the issue's: no 5xx, no 4xx (the server's 409 by design is an expected
conflict, counted apart), no hung request, no failed stream the client did not cut, KV blocks in use
back to the idle figure, no descriptors or threads left over, RSS within the idle process + the KV
pool + a stated overhead, and no TTFT drift (the last third's p50 against the middle third's, under
the same load; the first third is the warm-up).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from kvserve.bench.server_probe import ServerSample
from kvserve.bench.soak import SoakRun
from kvserve.bench.soak_client import Outcome, RequestRecord

# Descriptors the server may hold after the drain beyond its idle count without a leak: the disk
# tier's lazily opened files (index WAL, a chunk being written). A per-request leak is far larger.
FD_SLACK = 8
# anyio's worker threads (40 by default, kept ~10 s after use) and asyncio's default executor.
THREAD_SLACK = 48
RSS_OVERHEAD_BYTES = 1 << 30  # allocator and Python heap growth under load, beyond the touched pool
TTFT_DRIFT_LIMIT = 2.0  # last third's p50 TTFT over the middle third's


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class TtftWindow:
    start_s: float
    num_requests: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class SoakSummary:
    num_requests: int
    outcomes: dict[str, int]
    status_codes: dict[str, int]
    by_api: dict[str, dict[str, int]]
    by_kind: dict[str, int]
    cut_stages: dict[str, int]
    errors: list[str]  # first few, for the report
    ttft_windows: list[TtftWindow]
    ttft_drift: float | None
    rss_idle: int | None
    rss_max: int | None
    rss_drained: int | None
    rss_ceiling: int | None  # idle + pool bytes + overhead
    pool_bytes: int | None
    touched_bytes_drained: int | None
    fds_idle: int | None
    fds_drained: int | None
    threads_idle: int | None
    threads_max: int | None
    threads_drained: int | None
    blocks_used_idle: int | None
    blocks_used_drained: int | None
    drain_s: float
    disk_files: int | None
    disk_bytes: int | None
    index_checkpoints: int | None
    index_chunks: int | None
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def summarize(run: SoakRun, num_windows: int = 10) -> SoakSummary:
    records = run.records
    outcomes = Counter(r.outcome.value for r in records)
    by_api: dict[str, dict[str, int]] = {}
    for r in records:
        by_api.setdefault(r.api.value, Counter())[r.outcome.value] += 1  # type: ignore[index]
    windows = ttft_windows(records, run.options.duration_s, num_windows)
    idle, drained = run.idle, run.drained
    procs = [s.process for s in [idle, *run.samples, drained] if s.process is not None]
    pool = drained.pool or idle.pool
    pool_bytes = pool.num_blocks * pool.block_bytes if pool and pool.block_bytes else None
    rss_ceiling = None
    if idle.process is not None and pool_bytes is not None:
        rss_ceiling = idle.process.rss_bytes + pool_bytes + RSS_OVERHEAD_BYTES
    summary = SoakSummary(
        num_requests=len(records),
        outcomes=dict(outcomes),
        status_codes=dict(Counter(str(r.status) for r in records)),
        by_api={k: dict(v) for k, v in by_api.items()},
        by_kind=dict(Counter(r.kind for r in records)),
        cut_stages=dict(Counter(r.cut_stage for r in records if r.cut_stage)),
        errors=[
            f"{r.api.value} {r.kind}: {r.outcome.value} {r.status} {r.error}" for r in records if r.error
        ][:10],
        ttft_windows=windows,
        ttft_drift=ttft_drift(windows),
        rss_idle=_proc(idle, "rss_bytes"),
        rss_max=max((p.rss_bytes for p in procs), default=None),
        rss_drained=_proc(drained, "rss_bytes"),
        rss_ceiling=rss_ceiling,
        pool_bytes=pool_bytes,
        touched_bytes_drained=(
            drained.pool.num_touched_blocks * drained.pool.block_bytes if drained.pool is not None else None
        ),
        fds_idle=_proc(idle, "num_fds"),
        fds_drained=_proc(drained, "num_fds"),
        threads_idle=_proc(idle, "num_threads"),
        threads_max=max((p.num_threads for p in procs), default=None),
        threads_drained=_proc(drained, "num_threads"),
        blocks_used_idle=None if idle.pool is None else idle.pool.num_used_blocks,
        blocks_used_drained=None if drained.pool is None else drained.pool.num_used_blocks,
        drain_s=run.drain_s,
        disk_files=None if drained.disk is None else drained.disk.num_files,
        disk_bytes=None if drained.disk is None else drained.disk.num_bytes,
        index_checkpoints=None if drained.disk is None else drained.disk.num_checkpoint_rows,
        index_chunks=None if drained.disk is None else drained.disk.num_chunk_rows,
        checks=[],
    )
    return _with_checks(summary, outcomes)


def ttft_windows(records: list[RequestRecord], duration_s: float, num_windows: int) -> list[TtftWindow]:
    """p50/p99 TTFT of the completed requests, by when they started."""
    width = max(duration_s / num_windows, 1e-9)
    buckets: list[list[float]] = [[] for _ in range(num_windows)]
    for r in records:
        if r.outcome is Outcome.OK and r.ttft_s is not None:
            buckets[min(int(r.started_s / width), num_windows - 1)].append(r.ttft_s * 1000)
    return [TtftWindow(i * width, len(b), _pct(b, 50), _pct(b, 99)) for i, b in enumerate(buckets)]


def ttft_drift(windows: list[TtftWindow]) -> float | None:
    """The last third's median window p50 over the middle third's (None without data in both). The
    first third is the warm-up: every client's first, cold request lands there at once."""
    third = max(1, len(windows) // 3)
    middle = [w.p50_ms for w in windows[third:-third] if w.p50_ms is not None]
    last = [w.p50_ms for w in windows[-third:] if w.p50_ms is not None]
    if not middle or not last or statistics.median(middle) <= 0:
        return None
    return statistics.median(last) / statistics.median(middle)


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _proc(sample: ServerSample, field: str) -> int | None:
    return None if sample.process is None else getattr(sample.process, field)


def _with_checks(s: SoakSummary, outcomes: Counter[str]) -> SoakSummary:
    checks = [
        Check("no 5xx", outcomes[Outcome.HTTP_5XX.value] == 0, f"{outcomes[Outcome.HTTP_5XX.value]} 5xx"),
        Check(
            "no 4xx",
            outcomes[Outcome.HTTP_4XX.value] == 0,
            f"{outcomes[Outcome.HTTP_4XX.value]} 4xx; {outcomes[Outcome.CONFLICT.value]} expected 409 "
            "conflicts (tool continuation state gone: the history replayed)",
        ),
        Check("no hung request", outcomes[Outcome.HUNG.value] == 0, f"{outcomes[Outcome.HUNG.value]} hung"),
        Check(
            "no failed stream",
            outcomes[Outcome.FAILED.value] == 0,
            f"{outcomes[Outcome.FAILED.value]} failed",
        ),
        Check("requests completed", outcomes[Outcome.OK.value] > 0, f"{outcomes[Outcome.OK.value]} ok"),
    ]
    if s.blocks_used_idle is not None and s.blocks_used_drained is not None:
        checks.append(
            Check(
                "KV blocks back to idle",
                s.blocks_used_drained <= s.blocks_used_idle,
                f"{s.blocks_used_idle} in use idle, {s.blocks_used_drained} after the drain ({s.drain_s:.1f} s)",
            )
        )
    if s.fds_idle is not None and s.fds_drained is not None:
        checks.append(
            Check(
                "no leaked descriptors",
                s.fds_drained <= s.fds_idle + FD_SLACK,
                f"{s.fds_idle} idle, {s.fds_drained} after the drain (slack {FD_SLACK})",
            )
        )
    if s.threads_idle is not None and s.threads_drained is not None:
        checks.append(
            Check(
                "threads bounded",
                s.threads_drained <= s.threads_idle + THREAD_SLACK,
                f"{s.threads_idle} idle, {s.threads_max} max, {s.threads_drained} after (slack {THREAD_SLACK})",
            )
        )
    if s.rss_max is not None and s.rss_ceiling is not None:
        checks.append(
            Check(
                "RSS within idle + KV pool + overhead",
                s.rss_max <= s.rss_ceiling,
                f"max {s.rss_max / 2**20:.0f} MiB, ceiling {s.rss_ceiling / 2**20:.0f} MiB "
                f"(idle {s.rss_idle / 2**20:.0f} + pool {s.pool_bytes / 2**20:.0f} "
                f"+ {RSS_OVERHEAD_BYTES / 2**20:.0f})",
            )
        )
    if s.ttft_drift is not None:
        checks.append(
            Check(
                "no TTFT drift",
                s.ttft_drift <= TTFT_DRIFT_LIMIT,
                f"last/middle third p50 {s.ttft_drift:.2f}x",
            )
        )
    return SoakSummary(**{**s.__dict__, "checks": checks})
