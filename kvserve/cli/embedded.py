"""An in-process kvserve server on a free loopback port, for clients that embed the engine.

`kvserve agent`, `kvserve eval` and `kvserve bench` talk HTTP to a server either way: `--url` points
them at one, and without it they start this one in a thread. One code path for both modes means the
embedded run exercises exactly what a remote server would (rendering, tool parsing, the disk tier).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serve_in_thread(app: Any, start_timeout_s: float = 30.0) -> Iterator[tuple[str, Any]]:
    """Runs uvicorn on 127.0.0.1:<free port> in a daemon thread; yields (base url, server)."""
    import uvicorn

    from kvserve.api.http_server import server_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, name="kvserve-embedded-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the embedded kvserve server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def embedded_server(args: argparse.Namespace) -> Iterator[str]:
    """Builds the engine and app from `kvserve serve`'s flags (see `serve.add_serve_args`) and yields
    the base URL of a loopback server over them; the engine shuts down (and saves) on exit."""
    from kvserve.cli.serve import build_app, close_server

    # One front end: this process's (the --api-servers processes are `kvserve serve`'s own).
    app, engine = build_app(argparse.Namespace(**{**vars(args), "api_servers": "1"}))
    try:
        with serve_in_thread(app) as (url, _server):
            yield url
    finally:
        close_server(app, engine)
