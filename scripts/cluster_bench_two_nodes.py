"""`kvserve bench cluster` on a two-node Ray cluster started on this machine for the run (two `ray start`
processes of one CPU each, free ports, torn down after): the figures of docs/cluster.md.

    PYTHONPATH=. .venv/bin/python scripts/cluster_bench_two_nodes.py --agents 8 --turns 6 --kill-after 3 ...
    PYTHONPATH=. .venv/bin/python scripts/cluster_bench_two_nodes.py scaling --pin-cores 0,1 ...

Every argument goes to `kvserve bench cluster` (which takes `--address` from here), or, after
`scaling`, to `kvserve bench cluster-scaling` (one replica, then two: the throughput ratio)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.ray_cluster import two_node_ray


def main() -> int:
    # The bench connects to the cluster (to kill a replica): the same auth mode as its nodes.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with two_node_ray() as address:
        args = sys.argv[1:]
        bench = "cluster-scaling" if args[:1] == ["scaling"] else "cluster"
        args = args[1:] if bench == "cluster-scaling" else args
        command = [sys.executable, "-m", "kvserve", "bench", bench, "--address", address, *args]
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
