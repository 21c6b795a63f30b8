"""The two llama.cpp peers' command lines: the C++ `llama-server` and llama-cpp-python's server.

The C++ server (built by `make bench-peer` into the venv's `bin/`) runs `--parallel N` slots with
continuous batching and splits `--ctx-size` evenly across them, so it is given N × the per-sequence
context kvserve gets. llama-cpp-python's server decodes one sequence at a time.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Where `make bench-peer` links the binary (the venv this Python runs from), before $PATH.
VENV_LLAMA_SERVER = Path(sys.prefix) / "bin" / "llama-server"


@dataclass(frozen=True)
class GgufFacts:
    """What the llama-server command needs from the GGUF header."""

    context_length: int  # the model's trained context (`<arch>.context_length`)
    has_chat_template: bool  # `tokenizer.chat_template` present: render chats with it (--jinja)


def read_gguf_facts(path: Path) -> GgufFacts:
    from kvserve.models.loader.gguf_reader import read_gguf

    gguf = read_gguf(path)
    context_length = int(gguf.metadata.get(f"{gguf.architecture}.context_length", 0))
    return GgufFacts(context_length, bool(gguf.metadata.get("tokenizer.chat_template")))


def find_llama_server() -> Path | None:
    """The C++ llama-server binary: the venv's (make bench-peer), else one on $PATH, else None."""
    if VENV_LLAMA_SERVER.is_file():
        return VENV_LLAMA_SERVER
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_command(
    binary: str, gguf: str, port: int, *, ctx_per_slot: int, num_slots: int, threads: int, jinja: bool
) -> list[str]:
    """`ctx_per_slot` must be resolved (not 0): llama-server divides `--ctx-size` by `--parallel`."""
    assert ctx_per_slot > 0 and num_slots > 0
    cmd = [binary, "--model", gguf, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--ctx-size", str(ctx_per_slot * num_slots), "--parallel", str(num_slots)]
    # Same thread count as kvserve for prompt processing and for decode.
    cmd += ["--threads", str(threads), "--threads-batch", str(threads), "--cont-batching"]
    # The GGUF's own template renders chats, as kvserve's does; without one llama-server falls back
    # to ChatML whatever the flag, so it is given only where a template exists.
    if jinja:
        cmd.append("--jinja")
    return cmd


def llama_cpp_python_command(
    gguf: str, port: int, *, ctx: int, threads: int, parallel: int | None
) -> list[str]:
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--n_ctx", str(ctx)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    # By default a new request interrupts the stream in progress: that would cut every concurrent
    # stream short; with it off, requests queue behind one another (one sequence at a time).
    cmd += ["--interrupt_requests", "False"]
    if parallel and llama_cpp_python_has_option("n_parallel"):
        cmd += ["--n_parallel", str(parallel)]
    return cmd


def llama_cpp_python_available() -> str | None:
    """None when llama-cpp-python's server can be imported, else why not."""
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True, text=True, check=False
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    return lines[-1] if lines else "import llama_cpp.server failed"


@functools.cache
def llama_cpp_python_has_option(name: str) -> bool:
    """Whether this llama-cpp-python's server takes `--name` (0.3.x has no parallel decoding)."""
    probe = subprocess.run(
        [sys.executable, "-m", "llama_cpp.server", "--help"], capture_output=True, text=True, check=False
    )
    return f"--{name}" in probe.stdout
