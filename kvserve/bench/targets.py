"""What a benchmark runs against: a URL someone else runs, or a server the benchmark launches itself.

Named launch targets: `kvserve`, `kvserve-disk` (the same, but refuses to run without a disk KV
tier), `kvserve-no-kv-cache` (disk tier off), `llama-server` (llama.cpp's C++ server on the same
GGUF, `--parallel` slots) and `llama-cpp-python` (its Python server, one sequence at a time).
A kvserve that has the disk tier always gets a fresh `--kv-cache-dir` per run. Extra kvserve flags
pass through untouched, so targets work whichever flags this kvserve has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvserve.bench.client import StreamRules
from kvserve.bench.llama_server import find_llama_server, llama_cpp_python_available, read_gguf_facts
from kvserve.bench.peers import ServerKind, ServerProcess, ServerSpec, ServerStartError, kvserve_has_option

TARGET_NAMES = ("kvserve", "kvserve-disk", "kvserve-no-kv-cache", "llama-server", "llama-cpp-python")
_LLAMA_KINDS = {"llama-server": ServerKind.LLAMA_SERVER, "llama-cpp-python": ServerKind.LLAMA_CPP_PYTHON}


@dataclass(frozen=True)
class Target:
    label: str
    url: str | None = None  # set: an existing server; else `spec` is launched
    spec: ServerSpec | None = None
    needs_disk_tier: bool = False  # kvserve-disk: fail rather than run without the disk tier

    @property
    def rules(self) -> StreamRules:
        # llama-cpp-python's server sends no usage in streams (see client.StreamRules).
        is_python_llama = self.spec is not None and self.spec.kind is ServerKind.LLAMA_CPP_PYTHON
        return StreamRules(require_usage=not is_python_llama)


@dataclass(frozen=True)
class LaunchOptions:
    model: str
    ctx: int
    threads: int
    parallel: int | None
    kvserve_args: str = ""  # shell-quoted, appended to every kvserve target
    llama_args: str = ""


def launch_targets(names: list[str], options: LaunchOptions) -> list[Target]:
    """Targets for the given names; ValueError for an unknown name or a non-GGUF model for llama."""
    targets = []
    for name in names:
        if name not in TARGET_NAMES:
            raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGET_NAMES)}")
        if name in _LLAMA_KINDS:
            targets.append(Target(name, spec=_llama_spec(name, options)))
            continue
        # The peers' sampling: the benchmark requests send temperature 0 and llama-server adds no
        # penalty of its own; kvserve's preset for its default model would add a repetition penalty
        # and DRY to every step. The user's --kvserve-args come after, so they can put them back.
        extra = ("--generation-config", "none", *shlex.split(options.kvserve_args))
        if name == "kvserve-no-kv-cache":
            extra += ("--no-kv-cache",)
        spec = ServerSpec(
            name, ServerKind.KVSERVE, options.model, options.ctx, options.threads, options.parallel, extra
        )
        targets.append(Target(name, spec=spec, needs_disk_tier=name == "kvserve-disk"))
    return targets


def _llama_spec(name: str, options: LaunchOptions) -> ServerSpec:
    from kvserve.models.loader import resolve_model_path

    path = resolve_model_path(options.model)
    if path.suffix != ".gguf":
        raise ValueError(f"{name} needs a GGUF model, got {path}")
    kind = _LLAMA_KINDS[name]
    spec = ServerSpec(
        name,
        kind,
        str(path),
        options.ctx,
        options.threads,
        options.parallel,
        tuple(shlex.split(options.llama_args)),
    )
    if kind is not ServerKind.LLAMA_SERVER:
        return spec
    facts = read_gguf_facts(path)
    if not (options.ctx or facts.context_length):
        raise ValueError(f"{path} names no context length: pass --ctx for llama-server")
    binary = find_llama_server()
    # llama-server divides --ctx-size among its slots, so the per-sequence context must be known here.
    return dataclasses.replace(
        spec,
        ctx=options.ctx or facts.context_length,
        executable=str(binary) if binary else "llama-server",
        has_chat_template=facts.has_chat_template,
    )


def unavailable_reason(target: Target) -> str | None:
    """Why a target cannot run here (a llama.cpp peer not installed), or None."""
    if target.spec is None:
        return None
    if target.spec.kind is ServerKind.LLAMA_SERVER and find_llama_server() is None:
        return "the C++ llama-server is not built (make bench-peer)"
    if target.spec.kind is ServerKind.LLAMA_CPP_PYTHON:
        return llama_cpp_python_available()
    return None


@contextlib.contextmanager
def running(target: Target, log_dir: Path | None = None) -> Iterator[tuple[str, Callable[[], float] | None]]:
    """Yields (base URL, restart or None); restart only exists for servers launched here."""
    if target.url is not None:
        yield target.url, None
        return
    assert target.spec is not None
    with contextlib.ExitStack() as stack:
        spec = target.spec
        if _wants_fresh_cache_dir(target):
            # A fresh disk cache per run: nothing left by an earlier run (same seeds, same prompts)
            # can turn a cold prefill into a hit; a restart inside the run keeps the same directory.
            cache_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvserve-bench-kv-"))
            spec = dataclasses.replace(spec, extra_args=(*spec.extra_args, "--kv-cache-dir", cache_dir))
        server = stack.enter_context(ServerProcess(spec, log_dir))
        yield server.url, server.restart


def _wants_fresh_cache_dir(target: Target) -> bool:
    spec = target.spec
    if spec is None or spec.kind is not ServerKind.KVSERVE:
        return False
    if "--no-kv-cache" in spec.extra_args or "--kv-cache-dir" in spec.extra_args:
        return False
    if kvserve_has_option("kv-cache-dir"):
        return True
    if target.needs_disk_tier:
        raise ServerStartError(f"{target.label}: this kvserve has no --kv-cache-dir (no disk KV tier)")
    return False
