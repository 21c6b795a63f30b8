"""A cluster replica (a Ray Serve deployment): one engine and the FastAPI app of `kvserve serve` over
it, built by the same composition (`cli.serve.build_app`). Requests reach it as `ForwardedRequest`s
from the ingress and run through the app in-process (`asgi_bridge`), so every route, error shape and
stream is the one a single server gives."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kvserve.cluster.asgi_bridge import ForwardedRequest, ReplyHead, stream_asgi
from kvserve.cluster.replica_stats import ReplicaStats
from kvserve.cluster.routing_keys import RoutingKeys, response_id_prefix

logger = logging.getLogger(__name__)


def replica_kv_dir(base: str | None, slot: str) -> str:
    """The replica's own local disk tier under `base` (`--kv-cache-dir`, else the default): a tier's
    directory belongs to one server (it takes an exclusive lock, and repairs and evicts what it
    finds there), and the replicas of one node would otherwise share it. What they share is the
    shared tier (`--kv-shared-dir`, `--kv-s3-url`)."""
    from kvserve.kvstore.cache_dir import default_cache_dir

    return str(Path(base or default_cache_dir()) / f"replica-{slot}")


def _local_slot(context: Any, tag: str) -> str:
    """Ray's rank of the replica on its node: a replacement takes its predecessor's rank, and so its
    local checkpoints; the unique tag where Ray gives no rank."""
    rank = getattr(context, "rank", None)
    local = getattr(rank, "local_rank", None)
    return str(local) if isinstance(local, int) else tag


class KvserveReplica:
    def __init__(self, serve_args: argparse.Namespace, torch_threads: int) -> None:
        import ray
        import torch
        from ray import serve

        from kvserve.cli.serve import build_app

        # Ray's handlers are on the root logger already: kvserve's INFO lines (the start-up's choices) pass.
        logging.getLogger("kvserve").setLevel(logging.INFO)
        # Ray sets OMP_NUM_THREADS to the replica's num_cpus; torch's own count is set here, before the
        # engine thread starts (it inherits it).
        torch.set_num_threads(torch_threads)
        self.tag = serve.get_replica_context().replica_id.unique_id
        self.node_id = ray.get_runtime_context().get_node_id()
        context = serve.get_replica_context()
        args = argparse.Namespace(
            **{
                **vars(serve_args),
                "api_servers": "1",
                "response_id_prefix": response_id_prefix(self.tag),
                "kv_cache_dir": replica_kv_dir(serve_args.kv_cache_dir, _local_slot(context, self.tag)),
            }
        )
        self.app, self.engine = build_app(args)
        logger.info("cluster replica %s: serving with %d torch threads", self.tag, torch_threads)

    async def forward(self, keys: RoutingKeys, request: ForwardedRequest) -> AsyncIterator[ReplyHead | bytes]:
        """The app's reply to `request`, streamed; `keys` are the router's (Ray hands them to it)."""
        async for piece in stream_asgi(self.app, request, self.tag):
            yield piece

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve polls this (`request_routing_stats_period_s`) and hands it to the routers."""
        state = self.app.state
        sample = state.metrics.own.get_sample_value
        engine = state.console.engine_stats() if state.console.engine_stats is not None else None
        stats = ReplicaStats(
            tag=self.tag,
            pid=os.getpid(),
            node_id=self.node_id,
            num_running=engine.num_running if engine else 0,
            num_waiting=engine.num_waiting if engine else 0,
            kv_usage=engine.kv_usage if engine else 0.0,
            num_prompt_tokens=int(sample("kvserve_prompt_tokens_total") or 0),
            num_cached_prompt_tokens=int(sample("kvserve_cached_prompt_tokens_total") or 0),
            num_generation_tokens=int(sample("kvserve_generation_tokens_total") or 0),
            num_disk_hit_tokens=engine.disk.num_hit_tokens if engine and engine.disk else 0,
        )
        return stats.to_dict()

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine stopped is replaced (as /health says 503)."""
        if not self.engine.is_running:
            raise RuntimeError(f"replica {self.tag}: the engine is not running")

    def __del__(self) -> None:
        # Ray Serve's graceful stop: the disk tier's shutdown saves, as `kvserve serve` on SIGTERM.
        from kvserve.cli.serve import close_server

        if hasattr(self, "app"):
            close_server(self.app, self.engine)
