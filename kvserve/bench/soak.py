"""`kvserve bench soak`: N streaming clients for a set time, then the drain and the server's state.

The run: sample the idle server, start the clients (`soak_client.py`) and a sampler (`server_probe.py`)
every `sample_every_s`, stop new requests at the end of the duration, wait for the last requests,
then wait until the KV pool's in-use blocks are back to the idle figure (or `drain_timeout_s` passes)
and sample again. `soak_summary.py` turns the records and samples into figures and a verdict.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvserve.bench.server_probe import ServerProbe, ServerSample
from kvserve.bench.soak_client import RequestRecord, SoakClient, SoakMix, words


@dataclass(frozen=True)
class SoakOptions:
    num_clients: int = 8
    duration_s: float = 60.0
    mix: SoakMix = field(default_factory=SoakMix)
    model: str = "smollm2"  # the requests' `model` field
    # The shared system prompt, every conversation's common prefix: long enough (~800 tokens) for the
    # disk tier's cold save (>= 512 tokens before the last user turn), as an agent's is.
    system_words: int = 600
    sample_every_s: float = 2.0
    drain_timeout_s: float = 60.0
    seed: int = 0


@dataclass(frozen=True)
class SoakRun:
    options: SoakOptions
    records: list[RequestRecord]
    idle: ServerSample  # before the load
    samples: list[ServerSample]  # during it
    drained: ServerSample  # after the drain
    drain_s: float  # from the last request's end until blocks were back to idle (or the timeout)


async def run_soak(base_url: str, probe: ServerProbe, options: SoakOptions) -> SoakRun:
    import random

    system = "You are a coding agent working in a repository. " + words(
        random.Random(options.seed), options.system_words
    )
    limits = httpx.Limits(
        max_connections=options.num_clients + 8, max_keepalive_connections=options.num_clients + 8
    )
    timeout = httpx.Timeout(options.mix.deadline_s + 30, connect=30.0)
    async with _probe_client() as http:
        idle = await probe.sample(http)
    began = time.monotonic()
    stop_at = began + options.duration_s
    samples: list[ServerSample] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as http:
        clients = [
            SoakClient(i, http, base_url, options.model, system, options.mix, began, options.seed)
            for i in range(options.num_clients)
        ]
        sampler = asyncio.create_task(_sample_until_cancelled(probe, options.sample_every_s, samples))
        try:
            per_client = await asyncio.gather(*(c.run(stop_at) for c in clients))
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    # The clients' keep-alive connections are closed now: the drained sample sees what the idle one did
    # (the probe's own connection), so a descriptor left over is the server's.
    drain_began = time.monotonic()
    async with _probe_client() as http:
        drained = await _wait_for_idle_blocks(probe, http, idle, options.drain_timeout_s)
    drain_s = time.monotonic() - drain_began
    records = sorted((r for rs in per_client for r in rs), key=lambda r: r.started_s)
    return SoakRun(options, records, idle, samples, drained, drain_s)


def _probe_client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits, trust_env=False)


async def _sample_until_cancelled(probe: ServerProbe, every_s: float, out: list[ServerSample]) -> None:
    # Its own connection: the sampler never waits behind the clients' pool.
    async with _probe_client() as http:
        while True:
            out.append(await probe.sample(http))
            await asyncio.sleep(every_s)


async def _wait_for_idle_blocks(
    probe: ServerProbe, http: httpx.AsyncClient, idle: ServerSample, timeout_s: float
) -> ServerSample:
    """Aborted requests free their blocks at the next engine step; give the engine that long."""
    deadline = time.monotonic() + timeout_s
    while True:
        sample = await probe.sample(http)
        is_idle = (
            sample.pool is None
            or idle.pool is None
            or sample.pool.num_used_blocks <= idle.pool.num_used_blocks
        )
        if is_idle or time.monotonic() >= deadline:
            await asyncio.sleep(1.0)  # the server closes the clients' sockets as their FINs arrive
            return await probe.sample(http)
        await asyncio.sleep(0.5)


def default_cache_dir_of(extra_args: tuple[str, ...]) -> Path | None:
    """The `--kv-cache-dir` among a launched server's flags, if any."""
    args = list(extra_args)
    if "--kv-cache-dir" in args:
        index = args.index("--kv-cache-dir")
        if index + 1 < len(args):
            return Path(args[index + 1])
    return None
