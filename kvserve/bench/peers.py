"""Start and stop the servers a comparison runs against: kvserve and the llama.cpp peers.

Each server is a child process on a free loopback port, logging to a file; `start()` returns once
`GET /v1/models` answers 200 (or raises with the log's tail when the process dies or hangs), `stop()`
sends SIGTERM (kvserve saves its disk-tier checkpoints on it) and waits, then SIGKILL as a last resort.
"""

from __future__ import annotations

import enum
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from kvserve.bench.llama_server import llama_cpp_python_command, llama_server_command


class ServerKind(enum.Enum):
    KVSERVE = "kvserve"
    LLAMA_SERVER = "llama-server"  # llama.cpp's C++ server: --parallel slots, continuous batching
    LLAMA_CPP_PYTHON = "llama-cpp-python"  # `python -m llama_cpp.server`: one sequence at a time


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message carries its log's tail."""


@dataclass(frozen=True)
class ServerSpec:
    label: str  # the name in tables, CSV rows and plots
    kind: ServerKind
    model: str  # kvserve: alias/path as given; the llama.cpp peers: the GGUF path
    ctx: int  # per sequence (0 = the model's; resolved for llama-server, which splits it per slot)
    threads: int = os.cpu_count() or 1
    parallel: int | None = None  # concurrent sequences (kvserve --max-num-seqs, llama-server --parallel)
    extra_args: tuple[str, ...] = field(default=())
    executable: str = "llama-server"  # LLAMA_SERVER: the binary
    has_chat_template: bool = False  # LLAMA_SERVER: the GGUF carries one (--jinja)

    def command(self, port: int) -> list[str]:
        if self.kind is ServerKind.KVSERVE:
            cmd = [sys.executable, "-m", "kvserve", "serve", "--model", self.model, "--ctx", str(self.ctx)]
            cmd += ["--host", "127.0.0.1", "--port", str(port)]
            if self.parallel:
                cmd += ["--max-num-seqs", str(self.parallel)]
        elif self.kind is ServerKind.LLAMA_SERVER:
            cmd = llama_server_command(
                self.executable,
                self.model,
                port,
                ctx_per_slot=self.ctx,
                num_slots=self.parallel or 1,
                threads=self.threads,
                jinja=self.has_chat_template,
            )
        else:
            cmd = llama_cpp_python_command(
                self.model, port, ctx=self.ctx, threads=self.threads, parallel=self.parallel
            )
        return cmd + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.kind is ServerKind.KVSERVE:
            env.setdefault("OMP_NUM_THREADS", str(self.threads))  # torch's intra-op threads, like llama's
        return env


@functools.cache
def kvserve_has_option(name: str) -> bool:
    """Whether this kvserve's `serve` takes `--name` (a server older than its disk tier has none of its flags)."""
    probe = subprocess.run(
        [sys.executable, "-m", "kvserve", "serve", "--help"], capture_output=True, text=True, check=False
    )
    return f"--{name}" in probe.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One server child process; restartable on the same port (and the same disk cache, if any)."""

    def __init__(self, spec: ServerSpec, log_dir: Path | None = None, start_timeout_s: float = 600.0) -> None:
        self.spec = spec
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = (
            Path(log_dir or tempfile.mkdtemp(prefix="kvserve-bench-")) / f"{_slug(spec.label)}.log"
        )
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> str:
        """Launch and wait until it serves; returns the base URL."""
        assert self._process is None, "already started"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n$ {' '.join(self.spec.command(self.port))}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.spec.command(self.port), stdout=log, stderr=subprocess.STDOUT, env=self.spec.env()
            )
        self._wait_ready()
        return self.url

    def stop(self, timeout_s: float = 180.0) -> None:
        """SIGTERM and wait (a clean shutdown may write checkpoints); SIGKILL if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> float:
        """Stop then start again; returns the seconds the server was unavailable."""
        began = time.perf_counter()
        self.stop()
        self.start()
        return time.perf_counter() - began

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise ServerStartError(f"{self.spec.label} {_exit_reason(code)}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop(timeout_s=10)
        raise ServerStartError(
            f"{self.spec.label} did not answer within {self.start_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, num_lines: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])


def _exit_reason(code: int) -> str:
    if code >= 0:
        return f"exited with status {code}"
    name = signal.Signals(-code).name
    if name == "SIGILL":  # seen with llama-cpp-python wheels built for another CPU
        return "died of SIGILL: a native library uses instructions this CPU lacks (rebuild it for this CPU)"
    return f"died of {name}"


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in label).strip("-") or "server"
