"""The cluster's /metrics (served by the ingress): per-replica load and cache counters under vLLM's
names, labelled `replica`, the cluster's prefix-cache hit rate, the router's sessions per replica and
its decisions."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvserve.cluster import board
from kvserve.cluster.policy import REASONS


class BoardCollector:
    def __init__(self, source: board.RoutingBoard):
        self.source = source

    def collect(self) -> Iterator[Metric]:
        replicas, ongoing, sessions, decisions = self.source.snapshot()
        tags = sorted(replicas)
        info = GaugeMetricFamily(
            "kvserve_replica_info",
            "A live replica: its process and node",
            labels=["replica", "pid", "node_id"],
        )
        for tag in tags:
            info.add_metric([tag, str(replicas[tag].pid), replicas[tag].node_id], 1.0)
        yield info
        gauges = {
            "vllm:num_requests_running": ("Sequences running in the replica's engine", "num_running"),
            "vllm:num_requests_waiting": ("Requests queued in the replica's engine", "num_waiting"),
            "vllm:kv_cache_usage_perc": ("Fraction of the replica's KV blocks in use (0-1)", "kv_usage"),
        }
        for name, (help_text, field) in gauges.items():
            family = GaugeMetricFamily(name, help_text, labels=["replica"])
            for tag in tags:
                family.add_metric([tag], float(getattr(replicas[tag], field)))
            yield family
        counters = {
            "vllm:prefix_cache_queries": ("Prompt tokens looked up in the prefix cache", "num_prompt_tokens"),
            "vllm:prefix_cache_hits": (
                "Prompt tokens served from the cache (RAM or disk)",
                "num_cached_prompt_tokens",
            ),
            "vllm:generation_tokens": ("Generated tokens", "num_generation_tokens"),
            "kvserve_kv_disk_hit_tokens": (
                "Prompt tokens loaded from the disk KV tier",
                "num_disk_hit_tokens",
            ),
        }
        for name, (help_text, field) in counters.items():
            family = CounterMetricFamily(name, help_text, labels=["replica"])
            for tag in tags:
                family.add_metric([tag], float(getattr(replicas[tag], field)))
            yield family
        hit_rate = GaugeMetricFamily(
            "kvserve_prefix_cache_hit_rate",
            'Cached / prompt tokens since start (replica="all": the cluster)',
            labels=["replica"],
        )
        for tag in tags:
            hit_rate.add_metric([tag], replicas[tag].hit_rate)
        queries = sum(r.num_prompt_tokens for r in replicas.values())
        hits = sum(r.num_cached_prompt_tokens for r in replicas.values())
        hit_rate.add_metric(["all"], hits / queries if queries else 0.0)
        yield hit_rate
        in_flight = GaugeMetricFamily(
            "kvserve_router_requests_in_flight", "Requests the router has on each replica", labels=["replica"]
        )
        for tag in tags:
            in_flight.add_metric([tag], float(ongoing.get(tag, 0)))
        yield in_flight
        live_sessions = GaugeMetricFamily(
            "kvserve_router_sessions",
            "Live sessions (heard from in the last 30 minutes) the router keeps on each replica",
            labels=["replica"],
        )
        for tag in tags:
            live_sessions.add_metric([tag], float(sessions.get(tag, 0)))
        yield live_sessions
        routed = CounterMetricFamily(
            "kvserve_router_decisions",
            "Requests routed, by why (response, session, prefix, least_loaded) and where",
            labels=["reason", "replica"],
        )
        for reason in REASONS:
            for tag in sorted({t for _, t in decisions} | set(tags)):
                if decisions.get((reason, tag)):
                    routed.add_metric([reason, tag], float(decisions[(reason, tag)]))
        yield routed


def render_metrics(source: board.RoutingBoard | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(source or board.BOARD))
    return generate_latest(registry)
