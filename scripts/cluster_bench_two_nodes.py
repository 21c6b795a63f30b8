"""`kvserve bench cluster` on a two-node Ray cluster started on this machine for the run (two `ray start`
processes of one CPU each, free ports, torn down after): the figures of docs/cluster.md.

    PYTHONPATH=. .venv/bin/python scripts/cluster_bench_two_nodes.py --agents 8 --turns 6 --kill-after 3 ...

Every argument goes to `kvserve bench cluster` (which takes `--address` from here)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.ray_cluster import two_node_ray


def main() -> int:
    # The bench connects to the cluster (to kill a replica): the same auth mode as its nodes.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with two_node_ray() as address:
        command = [sys.executable, "-m", "kvserve", "bench", "cluster", "--address", address, *sys.argv[1:]]
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
