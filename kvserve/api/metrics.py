"""Prometheus metrics for GET /metrics: requests, tokens, cache hits, TTFT and inter-token latency.

Latencies are measured on the event stream the client receives (what a user feels), so
they include detokenization and stop-string hold-back. Each app has its own registry, so
several apps in one process (tests) do not collide. Engine gauges (queue depth, running
sequences, KV usage, prefix-cache hit rate) are read at scrape time from an EngineStatsSource.
With several API front ends (`serve --api-servers`), a scrape of any of them sums every front end's
request metrics (`peers`: their `snapshot()`s); the engine gauges come from the one engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    generate_latest,
)
from starlette.concurrency import run_in_threadpool

from kvserve.serving.engine_stats import EngineStats, EngineStatsSource
from kvserve.serving.events import GenerationEvent, ReasoningDelta, TextDelta, ToolCallArgsDelta, Usage

_CONTENT = (TextDelta, ReasoningDelta, ToolCallArgsDelta)
_KNOWN_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/models",
        "/health",
        "/metrics",
        "/tokenize",
        "/detokenize",
        "/",
    }
)

router = APIRouter()
# The other front ends' `Metrics.snapshot()` (None from one that did not answer).
PeerSnapshots = Callable[[], "list[list[Metric] | None]"]


class Metrics:
    def __init__(
        self, engine_stats: EngineStatsSource | None = None, peers: PeerSnapshots | None = None
    ) -> None:
        self.registry = CollectorRegistry()  # what /metrics shows: this front end's and the engine's
        self.own = CollectorRegistry()  # this front end's alone, summed with its peers' when it has some
        self.peers = peers  # set by `cli/api_servers.py` when there are several front ends
        self.registry.register(_Summed(self))
        r = self.own
        self.requests = Counter("kvserve_http_requests", "HTTP requests", ["path", "status"], registry=r)
        self.generations_in_flight = Gauge(
            "kvserve_generations_in_flight", "Generations being streamed", registry=r
        )
        self.prompt_tokens = Counter("kvserve_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_prompt_tokens = Counter(
            "kvserve_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache (hit rate = this / prompt_tokens)",
            registry=r,
        )
        self.generation_tokens = Counter("kvserve_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "kvserve_time_to_first_token_seconds",
            "Time to the first streamed delta",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.itl = Histogram(
            "kvserve_inter_token_latency_seconds",
            "Time between streamed deltas",
            buckets=(0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5),
            registry=r,
        )
        if engine_stats is not None:
            self._engine_gauges(engine_stats)

    def _engine_gauges(self, source: EngineStatsSource) -> None:
        gauges = {
            "kvserve_num_running_seqs": ("Sequences running in the engine", lambda s: s.num_running),
            "kvserve_num_waiting_seqs": ("Requests queued in the engine", lambda s: s.num_waiting),
            "kvserve_kv_cache_usage": ("Fraction of KV blocks in use", lambda s: s.kv_usage),
            "kvserve_prefix_cache_hit_rate": (
                "Prompt tokens found in the prefix cache / looked up",
                lambda s: s.prefix_cache_hit_rate,
            ),
        }
        for name, (help_text, read) in gauges.items():
            gauge = Gauge(name, help_text, registry=self.registry)
            gauge.set_function(lambda read=read: float(read(source())))
        # The engine's optional parts (EngineStats.disk, .encoder_cache): 0 where it has none.
        parts = {
            "disk": {
                "kvserve_kv_disk_hits": ("Requests that loaded a prefix from the disk KV cache", "num_hits"),
                "kvserve_kv_disk_hit_tokens": (
                    "Prompt tokens loaded from the disk KV cache",
                    "num_hit_tokens",
                ),
                "kvserve_kv_disk_saves": ("Checkpoints written to the disk KV cache", "num_saves"),
                "kvserve_kv_disk_saved_bytes": ("Bytes written to the disk KV cache", "num_saved_bytes"),
                "kvserve_kv_disk_entries": ("Checkpoints in the disk KV cache", "num_checkpoints"),
                "kvserve_kv_disk_bytes": ("Bytes used by the disk KV cache", "num_bytes"),
                "kvserve_kv_disk_evictions": ("Checkpoints evicted from the disk KV cache", "num_evictions"),
                "kvserve_kv_shared_hits": (
                    "Requests that loaded a prefix from the KV tier shared by replicas",
                    "num_shared_hits",
                ),
                "kvserve_kv_shared_hit_tokens": (
                    "Prompt tokens loaded from the KV tier shared by replicas",
                    "num_shared_hit_tokens",
                ),
            },
            "encoder_cache": {
                "kvserve_encoder_cache_hits": ("Images whose vision-encoder output was kept", "num_hits"),
                "kvserve_encoder_cache_misses": ("Images the vision encoder had to encode", "num_misses"),
                "kvserve_encoder_cache_entries": ("Images in the vision-encoder output cache", "num_entries"),
                "kvserve_encoder_cache_bytes": ("Bytes of the vision-encoder output cache", "num_bytes"),
            },
        }
        for part, gauges in parts.items():
            for name, (help_text, field) in gauges.items():
                gauge = Gauge(name, help_text, registry=self.registry)
                gauge.set_function(lambda part=part, field=field: float(_part_stat(source(), part, field)))

    def snapshot(self) -> list[Metric]:
        """This front end's request metrics, for a peer's scrape."""
        return list(self.own.collect())

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(path if path in _KNOWN_PATHS else "other", str(status)).inc()

    async def observe(self, events: AsyncIterator[GenerationEvent]) -> AsyncIterator[GenerationEvent]:
        started = last = time.monotonic()
        first = True
        usage: Usage | None = None
        self.generations_in_flight.inc()
        try:
            async for event in events:
                if isinstance(event, _CONTENT):
                    now = time.monotonic()
                    (self.ttft if first else self.itl).observe(now - (started if first else last))
                    first, last = False, now
                elif isinstance(event, Usage):
                    usage = event
                yield event
        finally:
            self.generations_in_flight.dec()
            await events.aclose()  # type: ignore[attr-defined]
            if usage is not None:
                self.prompt_tokens.inc(usage.prompt_tokens)
                self.cached_prompt_tokens.inc(usage.cached_tokens)
                self.generation_tokens.inc(usage.completion_tokens)


class _Summed:
    """The collector of `Metrics.own`, summed over the front ends (blocks on the peers: scrape
    off the event loop)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        own = self.metrics.snapshot()
        if self.metrics.peers is None:
            return iter(own)
        return iter(sum_families([own, *(p for p in self.metrics.peers() if p is not None)]))


def sum_families(snapshots: Iterable[list[Metric]]) -> list[Metric]:
    """Metric families of several processes as one: counters, histograms and gauges summed per
    sample (name and labels), `_created` timestamps the earliest."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for snapshot in snapshots:
        for family in snapshot:
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            totals = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in totals:
                    totals[key] = sample.value
                elif sample.name.endswith("_created"):
                    totals[key] = min(totals[key], sample.value)
                else:
                    totals[key] += sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return list(families.values())


def _part_stat(stats: EngineStats, part: str, field: str) -> int:
    counts = getattr(stats, part)
    return 0 if counts is None else getattr(counts, field)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    # Off the loop: the engine gauges and the peers' snapshots are answers from other processes.
    text = await run_in_threadpool(generate_latest, request.app.state.metrics.registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
