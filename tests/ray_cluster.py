"""A real two-node Ray cluster on this machine (two `ray start` processes, every port chosen free) and
`kvserve cluster` on it, for the tests; torn down by process id, never with `ray stop` (which would
stop every Ray cluster on a shared machine)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from kvserve.bench.process_tree import process_tree
from tests.serve_process import REPO, child_env, free_port

RAY = str(Path(sys.executable).with_name("ray"))


def _env() -> dict[str, str]:
    # The workers import this checkout's kvserve (not another editable install's). Token auth off, and
    # said so: Ray 2.60 turns it on for `ray start` when ~/.ray/auth_token exists, which any local
    # `ray.init()` on this machine writes, and then the two nodes disagree.
    return child_env(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")


def _node_ports() -> list[str]:
    return [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        "--object-store-memory=100000000",
        "--min-worker-port=0",  # random worker ports: two nodes on one host must not share a range
        "--max-worker-port=0",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


@contextmanager
def two_node_ray() -> Iterator[str]:
    """Yields the head's address. The temp dir is short: Ray's socket paths must fit in 107 bytes."""
    temp_dir = tempfile.mkdtemp(prefix="kvr-", dir="/tmp")
    port = free_port()
    head = [
        RAY, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}", "--disable-usage-stats",
        *_node_ports(),
    ]  # fmt: skip
    worker = [RAY, "start", f"--address=127.0.0.1:{port}", *_node_ports()]
    try:
        for command in (head, worker):
            done = subprocess.run(
                command, check=False, env=_env(), capture_output=True, text=True, timeout=180
            )
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command[:3])} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        _stop_processes_of(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop_processes_of(temp_dir: str) -> None:
    """SIGTERM, then SIGKILL, every process whose command line names the cluster's temp dir (GCS,
    raylets, their agents) and their descendants (the workers)."""
    pids = process_tree(lambda args: any(temp_dir in arg for arg in args))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM:
            time.sleep(2)


@contextmanager
def kvserve_cluster(address: str, args: Sequence[str], log: Path, timeout_s: float = 300) -> Iterator[str]:
    """`kvserve cluster --address ADDRESS ARGS` until its application answers; yields its URL."""
    http_port = free_port()
    command = [
        sys.executable,
        "-m",
        "kvserve",
        "cluster",
        f"--address={address}",
        f"--port={http_port}",
        *args,
    ]
    with log.open("a") as out:
        process = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=out, stderr=out)
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + timeout_s
        # Up once `kvserve cluster` says so (Ray's serve.run returned: every replica runs; the proxy
        # answers as soon as one does).
        while not (_answers(url) and "kvserve cluster: " in log.read_text()):
            if process.poll() is not None:
                raise AssertionError(
                    f"kvserve cluster exited with {process.returncode}:\n{log.read_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"kvserve cluster did not start:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
