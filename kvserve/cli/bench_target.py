"""The server a reliability bench (`soak`, `hostile`) runs against: `--url` (with `--pid` and
`--kv-cache-dir` for what it samples), or one it launches with `make serve`'s settings and a fresh
disk cache. Yields a `ServerProbe` that knows the server's URL, process and KV directory."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.bench.server_probe import ServerProbe


def add_server_args(p: argparse.ArgumentParser, verb: str) -> argparse._ArgumentGroup:
    g = p.add_argument_group("server")
    g.add_argument("--url", default=None, help=f"{verb} this running server instead of launching one")
    g.add_argument("--pid", type=int, default=None, help="--url: its process id (RSS, descriptors, threads)")
    g.add_argument("--kv-cache-dir", type=Path, default=None, help="--url: its disk tier (files, index rows)")
    g.add_argument("--model", "-m", default="smollm2", help="launched server's model (make serve's default)")
    g.add_argument("--ctx", type=int, default=16384, help="launched server's context (make serve's CTX)")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="launched server's CPU threads")
    g.add_argument("--kvserve-args", default="", help="extra `kvserve serve` flags, one shell-quoted string")
    g.add_argument("--log-dir", type=Path, default=None, help="launched server's log (default: a temp dir)")
    return g


@contextlib.contextmanager
def target_server(
    args: argparse.Namespace, say: Callable[[str], None], extra_args: tuple[str, ...] = ()
) -> Iterator[ServerProbe]:
    from kvserve.bench.peers import ServerKind, ServerProcess, ServerSpec
    from kvserve.bench.server_probe import ServerProbe

    if args.url:
        yield ServerProbe(args.url, args.pid, args.kv_cache_dir)
        return
    with tempfile.TemporaryDirectory(prefix="kvserve-bench-kv-") as cache_dir:
        extra = (*shlex.split(args.kvserve_args), *extra_args, "--kv-cache-dir", cache_dir)
        spec = ServerSpec("kvserve", ServerKind.KVSERVE, args.model, args.ctx, args.threads, None, extra)
        with ServerProcess(spec, args.log_dir) as server:
            say(f"server: {server.url} (pid {server.pid}), log {server.log_path}")
            yield ServerProbe(server.url, server.pid, Path(cache_dir))
