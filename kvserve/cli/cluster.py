"""`kvserve cluster`: N kvserve replicas on a Ray cluster behind Ray Serve's HTTP proxy, routed by
session and prefix (docs/cluster.md). Takes every `kvserve serve` flag; --host/--port are the proxy's."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from kvserve.cli.serve import _positive_int, add_serve_args

if TYPE_CHECKING:  # Ray is an extra: imported when a command needs it
    from ray.serve import Application

    from kvserve.cluster.application import ClusterSpec

logger = logging.getLogger(__name__)

APP_NAME = "kvserve"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster",
        help="serve N replicas on a Ray cluster (Ray Serve), routed by session and prefix",
        description=__doc__,
    )
    add_serve_args(p)
    add_cluster_args(p)
    p.set_defaults(func=run)


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="the Ray cluster to join (default $RAY_ADDRESS, else `auto`: the one `ray start` runs here); "
        "`local` starts a private one-node cluster in this process",
    )
    g.add_argument(
        "--replicas", type=_positive_int, default=2, help="kvserve replicas (engine + front end each)"
    )
    g.add_argument(
        "--num-cpus-per-replica",
        type=float,
        default=1.0,
        help="Ray CPUs reserved by each replica (on CPU: its share of cores; Ray sets OMP_NUM_THREADS to it)",
    )
    g.add_argument(
        "--torch-threads",
        type=_positive_int,
        default=None,
        help="torch threads in each replica (default: --num-cpus-per-replica, at least 1)",
    )
    g.add_argument(
        "--num-gpus-per-replica",
        type=float,
        default=0.0,
        help="Ray GPUs reserved by each replica (1 on CUDA: one replica per GPU; pass --device cuda too)",
    )
    g.add_argument(
        "--max-replicas-per-node", type=_positive_int, default=None, help="spread replicas over the nodes"
    )
    g.add_argument(
        "--router",
        choices=["affinity", "ray"],
        default="affinity",
        help="affinity: kvserve's session/prefix router; ray: Ray Serve's default (power of two choices)",
    )
    g.add_argument(
        "--max-load",
        type=_positive_int,
        default=16,
        help="requests in flight at which a replica takes no new sessions (its sessions stay)",
    )


def parse_cluster_args(argv: list[str]) -> argparse.Namespace:
    """`kvserve cluster`'s flags outside the command line (a RayService's `args`)."""
    parser = argparse.ArgumentParser(prog="kvserve cluster")
    add_serve_args(parser)
    add_cluster_args(parser)
    return parser.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    from kvserve.cluster.application import ClusterSpec
    from kvserve.cluster.policy import PolicySettings

    return ClusterSpec(
        num_replicas=args.replicas,
        num_cpus_per_replica=args.num_cpus_per_replica,
        num_gpus_per_replica=args.num_gpus_per_replica,
        torch_threads=args.torch_threads or max(1, int(args.num_cpus_per_replica)),
        router=args.router,
        policy=PolicySettings(max_load=args.max_load),
        max_replicas_per_node=args.max_replicas_per_node,
    )


def run(args: argparse.Namespace) -> None:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SystemExit("kvserve cluster needs Ray Serve: pip install 'kvserve[cluster]'") from None
    from kvserve.cluster.application import build_application

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logger.warning("listening on %s without --api-key: anyone who can reach it can use it", args.host)
    ray.init(address=None if args.address == "local" else args.address)
    serve.start(http_options={"host": args.host, "port": args.port})
    spec = spec_from_args(args)
    serve.run(build_application(args, spec), name=APP_NAME, route_prefix="/")
    logger.info(
        "kvserve cluster: %d replicas (%s router) on http://%s:%d; Ctrl-C stops the application",
        spec.num_replicas,
        spec.router,
        args.host,
        args.port,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    logger.info("kvserve cluster: stopping (each replica saves its disk checkpoints)")
    serve.delete(APP_NAME)
    serve.shutdown()


def app_builder(args: dict[str, str]) -> Application:
    """For a Serve config file or KubeRay's RayService (`import_path: kvserve.cli.cluster:app_builder`):
    `args: {flags: "<kvserve cluster flags>"}`, the same flags as the command line
    (deploy/kuberay-rayservice.yaml). Ray's config, not these flags, says where the proxy listens."""
    import shlex

    from kvserve.cluster.application import build_application

    parsed = parse_cluster_args(shlex.split(args.get("flags", "")))
    return build_application(parsed, spec_from_args(parsed))
