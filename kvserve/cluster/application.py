"""The Ray Serve application of `kvserve cluster`: N replica deployments (engine + app each) behind one
ingress, with kvserve's request router on the ingress's handle (or Ray's default, to compare)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from kvserve.cluster.ingress import ClusterIngress, IngressSettings
from kvserve.cluster.policy import PolicySettings
from kvserve.cluster.ray_router import KvserveRequestRouter
from kvserve.cluster.replica import KvserveReplica

RouterKind = Literal["affinity", "ray"]
# How often replicas publish their stats to the routers (Ray's default is 10 s): /metrics' freshness.
_STATS_PERIOD_S = 2.0


@dataclass(frozen=True)
class ClusterSpec:
    num_replicas: int = 2
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    torch_threads: int = 1
    router: RouterKind = "affinity"
    policy: PolicySettings = field(default_factory=PolicySettings)
    max_replicas_per_node: int | None = None
    # Requests Ray lets into one replica at once; the engine queues past --max-num-seqs itself.
    max_ongoing_requests: int = 256


def build_application(serve_args: argparse.Namespace, spec: ClusterSpec) -> Application:
    """`serve_args`: `kvserve serve`'s flags, which every replica is built from."""
    replica_options: dict[str, object] = {
        "name": "kvserve-replica",
        "num_replicas": spec.num_replicas,
        "ray_actor_options": {"num_cpus": spec.num_cpus_per_replica, "num_gpus": spec.num_gpus_per_replica},
        "max_ongoing_requests": spec.max_ongoing_requests,
        # A model load takes a while on CPU; Ray's default health check would give up first.
        "health_check_timeout_s": 120,
        "graceful_shutdown_timeout_s": 60,
    }
    if spec.max_replicas_per_node is not None:
        replica_options["max_replicas_per_node"] = spec.max_replicas_per_node
    if spec.router == "affinity":
        replica_options["request_router_config"] = RequestRouterConfig(
            request_router_class=KvserveRequestRouter,
            request_router_kwargs=vars(spec.policy),
            request_routing_stats_period_s=_STATS_PERIOD_S,
        )
    else:
        replica_options["request_router_config"] = RequestRouterConfig(
            request_routing_stats_period_s=_STATS_PERIOD_S
        )
    replica = serve.deployment(KvserveReplica).options(**replica_options)
    ingress = serve.deployment(ClusterIngress).options(
        name="kvserve-ingress",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,  # streams are long; the replicas' own limit is the real one
    )
    args = argparse.Namespace(**{k: v for k, v in vars(serve_args).items() if k != "func"})
    settings = IngressSettings(max_body_bytes=args.max_body_mb * 2**20, api_key=args.api_key)
    return ingress.bind(replica.bind(args, spec.torch_threads), settings)
