"""`kvserve serve` as a child process for the tests that need the real server's lifecycle
(restarts, SIGTERM's shutdown save, kill -9): start it, wait for /health, stop it. Their
reference servers, whose lifecycle is not under test, can run in this process instead."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from kvserve.cli.embedded import embedded_server
from kvserve.cli.serve import add_serve_args

REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that must import this checkout's kvserve: the checkout
    first on PYTHONPATH and whatever the caller had there after it (packages installed outside the
    virtualenv, e.g. a `pip install --target` folder, which replacing PYTHONPATH would hide)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: Sequence[str], log: Path, timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
    """Start `kvserve serve ARGS` (its output appended to `log`); returns once /health answers."""
    port = free_port()
    command = [sys.executable, "-m", "kvserve", "serve", "--port", str(port), *args]
    env = child_env()
    with log.open("a") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop_server(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM, which must end in a clean exit (after the disk tier's shutdown saves)."""
    process.send_signal(signal.SIGTERM)
    try:
        rc = process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert rc == 0, log.read_text()[-3000:]


@contextmanager
def running_server(args: Sequence[str], log: Path) -> Iterator[str]:
    """A server for the block's duration, stopped with SIGTERM (which must exit cleanly)."""
    process, url = start_server(args, log)
    try:
        yield url
    except BaseException:
        process.kill()
        process.wait()
        raise
    stop_server(process, log)


@contextmanager
def in_process_server(args: Sequence[str]) -> Iterator[str]:
    """The app `kvserve serve ARGS` builds (the same `build_app`), on a thread of this process: a
    reference to compare with, without the 10-20 s start of another interpreter and model load."""
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with embedded_server(parser.parse_args(list(args))) as url:
        yield url
