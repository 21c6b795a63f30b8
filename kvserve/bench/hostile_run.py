"""`kvserve bench hostile`: every case of `hostile.py` in turn against one server, its RSS, descriptors
and KV blocks sampled before, during (max) and after, and a verdict: no 5xx, nothing hung, memory
bounded, descriptors and blocks back where they were, and a plain request still answered at the end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from kvserve.bench import hostile
from kvserve.bench.server_probe import ServerProbe, ServerSample

# What the server may keep after the cases beyond its idle RSS: the allocator's high-water mark of the
# bodies it read (64 MiB each at most) and of 10,000 connections' state.
RSS_SLACK_BYTES = 512 * 2**20
FD_SLACK = 8


@dataclass(frozen=True)
class HostileOptions:
    num_connections: int = 10_000
    num_slowloris: int = 256
    num_slow_readers: int = 16
    slow_reader_hold_s: float = 20.0
    slow_reader_max_tokens: int = 4096
    max_body_bytes: int = 64 * 2**20  # the server's --max-body-mb


@dataclass(frozen=True)
class HostileReport:
    cases: list[hostile.CaseResult]
    idle: ServerSample
    after: ServerSample
    rss_max: int | None
    still_serving: bool
    checks: list[tuple[str, bool, str]]

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


async def run_hostile(
    base_url: str,
    probe: ServerProbe,
    options: HostileOptions,
    on_case: Callable[[hostile.CaseResult], None] = lambda _: None,
) -> HostileReport:
    """Every case in turn; `on_case` hears each result as it comes (a long run reports as it goes)."""
    target = hostile.Target(base_url)
    samples: list[ServerSample] = []
    # A generous timeout: on a loaded CPU an accepted request (max_tokens 1) may queue for minutes.
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), trust_env=False) as http:
        idle = await probe.sample(http)
        sampler = asyncio.create_task(_sample(probe, samples))
        runs: list[Callable[[], Awaitable[hostile.CaseResult]]] = [
            lambda: hostile.slow_reader_case(
                target, options.num_slow_readers, options.slow_reader_hold_s, options.slow_reader_max_tokens
            ),
            lambda: hostile.slowloris_case(target, options.num_slowloris, give_up_s=60.0),
            lambda: hostile.churn_case(target, options.num_connections),
            lambda: hostile.oversized_head_case(target),
            lambda: hostile.oversized_body_case(http, target, options.max_body_bytes),
            lambda: hostile.invalid_utf8_case(http, target),
            lambda: hostile.deep_nesting_case(http, target),
        ]
        cases = []
        for run in runs:
            cases.append(await run())
            on_case(cases[-1])
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        serving = await hostile.still_serving(http, target)
    await asyncio.sleep(6.0)  # past uvicorn's 5 s keep-alive: the cases' idle connections are closed
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
        after = await _wait_for_idle_blocks(probe, http, idle)
    rss = [s.process.rss_bytes for s in (idle, *samples, after) if s.process is not None]
    report = HostileReport(cases, idle, after, max(rss, default=None), serving, [])
    return HostileReport(**{**report.__dict__, "checks": _checks(report)})


async def _sample(probe: ServerProbe, out: list[ServerSample]) -> None:
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
        while True:
            out.append(await probe.sample(http))
            await asyncio.sleep(1.0)


async def _wait_for_idle_blocks(
    probe: ServerProbe, http: httpx.AsyncClient, idle: ServerSample
) -> ServerSample:
    for _ in range(60):
        sample = await probe.sample(http)
        if (
            sample.pool is None
            or idle.pool is None
            or sample.pool.num_used_blocks <= idle.pool.num_used_blocks
        ):
            return sample
        await asyncio.sleep(0.5)
    return sample


def _checks(r: HostileReport) -> list[tuple[str, bool, str]]:
    num_5xx = sum(c.num_5xx for c in r.cases)
    num_hung = sum(c.num_hung for c in r.cases)
    checks = [
        ("no 5xx", num_5xx == 0, f"{num_5xx} 5xx"),
        ("nothing hung", num_hung == 0, f"{num_hung} requests or connections still open at their deadline"),
        ("still serving", r.still_serving, "GET /health and a chat completion after the cases"),
    ]
    idle, after = r.idle, r.after
    if idle.process is not None and after.process is not None and r.rss_max is not None:
        bound = idle.process.rss_bytes + RSS_SLACK_BYTES
        checks.append(
            (
                "memory bounded",
                r.rss_max <= bound,
                (
                    f"RSS idle {idle.process.rss_bytes / 2**20:.0f} MiB, max {r.rss_max / 2**20:.0f}, "
                    f"after {after.process.rss_bytes / 2**20:.0f} (bound idle + {RSS_SLACK_BYTES / 2**20:.0f})"
                ),
            )
        )
        checks.append(
            (
                "no leaked descriptors",
                after.process.num_fds <= idle.process.num_fds + FD_SLACK,
                f"{idle.process.num_fds} idle, {after.process.num_fds} after (slack {FD_SLACK})",
            )
        )
    if idle.pool is not None and after.pool is not None:
        checks.append(
            (
                "KV blocks back to idle",
                after.pool.num_used_blocks <= idle.pool.num_used_blocks,
                f"{idle.pool.num_used_blocks} in use idle, {after.pool.num_used_blocks} after",
            )
        )
    return checks
