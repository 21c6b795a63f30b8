"""`kvserve bench serve`: open-loop load against one endpoint, vLLM `benchmark_serving` style.

Requests leave on a Gamma-distributed schedule (Poisson when burstiness = 1, all at once when the rate
is infinite), at most `max_concurrency` in flight; every stream is timed per chunk by `client.py`.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from tqdm import tqdm

from kvserve.bench.client import (
    STRICT,
    Api,
    HttpRequest,
    StreamRules,
    new_http_client,
    request_body,
    stream_request,
)
from kvserve.bench.datasets import BenchRequest
from kvserve.bench.metrics import RequestResult


@dataclass(frozen=True)
class LoadShape:
    request_rate: float = math.inf  # requests per second; inf = all at t=0
    burstiness: float = 1.0  # Gamma shape; 1 = Poisson arrivals
    max_concurrency: int | None = None
    seed: int = 0
    # Client processes sharing the load: one Python process parses ~20K SSE events/s, less than a
    # GPU server streams at 256 concurrent requests, so the client would be what is measured.
    num_clients: int = 1


@dataclass(frozen=True)
class ServeTarget:
    base_url: str
    api: Api = Api.COMPLETIONS
    model: str | None = None
    rules: StreamRules = STRICT
    logit_bias: dict[str, float] | None = None  # suppress EOS so every request produces its output_len
    ignore_eos: bool = False  # or suppress it with the request's `ignore_eos` field


def arrival_offsets(num_requests: int, shape: LoadShape) -> list[float]:
    """Send times in seconds from the benchmark start (pure; gaps ~ Gamma(k, 1/(rate·k)))."""
    if math.isinf(shape.request_rate):
        return [0.0] * num_requests
    if shape.request_rate <= 0 or shape.burstiness <= 0:
        raise ValueError("request rate and burstiness must be positive")
    rng = random.Random(shape.seed)
    theta = 1.0 / (shape.request_rate * shape.burstiness)
    offsets, t = [], 0.0
    for _ in range(num_requests):
        offsets.append(t)
        t += rng.gammavariate(shape.burstiness, theta)
    return offsets


async def run_serve_bench(
    target: ServeTarget, requests: list[BenchRequest], shape: LoadShape, progress: bool = True
) -> tuple[list[RequestResult], float]:
    """Runs the load; returns per-request results (in dataset order) and the wall time in seconds."""
    offsets = arrival_offsets(len(requests), shape)
    limit = asyncio.Semaphore(shape.max_concurrency or len(requests) or 1)
    bar = tqdm(total=len(requests), desc=f"bench serve {target.base_url}", disable=not progress, unit="req")
    async with new_http_client() as http:
        start = time.perf_counter()

        async def one(request: BenchRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            body = request_body(
                target.api,
                request.prompt,
                request.output_len,
                model=target.model,
                logit_bias=target.logit_bias,
                ignore_eos=target.ignore_eos,
            )
            async with limit:
                result = await stream_request(
                    http, target.base_url, HttpRequest(target.api, body, request.prompt_len), target.rules
                )
            bar.update(1)
            return result

        results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
        duration = time.perf_counter() - start
    bar.close()
    return list(results), duration


def run_serve_bench_sharded(
    target: ServeTarget, requests: list[BenchRequest], shape: LoadShape, progress: bool = True
) -> tuple[list[RequestResult], float]:
    """`run_serve_bench` over `shape.num_clients` processes: requests dealt round-robin, the concurrency
    (and a finite rate) split between them. Results come back in dataset order; the wall time spans all."""
    shards = _shards(len(requests), shape)
    if len(shards) <= 1:
        results, duration, busy = _run_shard(target, requests, shape, progress)
        _report_client_load([busy], duration)
        return results, duration
    start = time.perf_counter()
    # fork: the client processes need nothing but this module's code, and start in milliseconds.
    with ProcessPoolExecutor(len(shards), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [
            pool.submit(_run_shard, target, [requests[i] for i in indices], shard_shape)
            for indices, shard_shape in shards
        ]
        outcomes = [future.result() for future in futures]  # (results, duration, busy) each
    duration = time.perf_counter() - start
    _report_client_load([busy for _, _, busy in outcomes], duration)
    results: list[RequestResult | None] = [None] * len(requests)
    for (indices, _), (found, _, _) in zip(shards, outcomes, strict=True):
        for i, result in zip(indices, found, strict=True):
            results[i] = result
    assert all(r is not None for r in results)
    return results, duration  # type: ignore[return-value]


def _shards(num_requests: int, shape: LoadShape) -> list[tuple[list[int], LoadShape]]:
    """(request indices, load) per client process; never more processes than concurrent requests."""
    limit = shape.max_concurrency or num_requests or 1
    n = max(1, min(shape.num_clients, limit, num_requests))
    shards = []
    for k in range(n):
        concurrency = limit // n + (k < limit % n)
        rate = shape.request_rate / n
        shards.append(
            (
                list(range(k, num_requests, n)),
                replace(
                    shape, request_rate=rate, max_concurrency=concurrency, seed=shape.seed + k, num_clients=1
                ),
            )
        )
    return shards


def _run_shard(
    target: ServeTarget, requests: list[BenchRequest], shape: LoadShape, progress: bool = False
) -> tuple[list[RequestResult], float, float]:
    """Results, the run's wall time, and the share of one core this client process used meanwhile
    (CPU and wall time over the same span, the event loop's set-up included, so a run whose requests
    all failed at once does not divide the set-up's CPU by a run of milliseconds)."""
    cpu, wall = time.process_time(), time.perf_counter()
    results, duration = asyncio.run(run_serve_bench(target, requests, shape, progress))
    return results, duration, (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)


# Below this a run is start-up more than load (or every request failed at once): no verdict.
_MIN_RUN_S_FOR_CLIENT_WARNING = 1.0


def _report_client_load(busy: list[float], duration: float) -> None:
    """Whether the client itself may be the bound (one Python process parses ~10-20K SSE events/s)."""
    shares = " ".join(f"{b:.0%}" for b in busy)
    print(f"client CPU per process (share of one core over its run): {shares}", file=sys.stderr)
    if max(busy) > 0.85 and duration >= _MIN_RUN_S_FOR_CLIENT_WARNING:
        print(
            "warning: a client process was busy most of the run: the client may be the limit "
            "(raise --client-procs)",
            file=sys.stderr,
        )
