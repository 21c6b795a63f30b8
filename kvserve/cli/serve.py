"""`kvserve serve`: the OpenAI + Anthropic compatible HTTP server over one engine."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.cli.engine_args import (
    add_engine_args,
    add_kv_store_args,
    build_engine,
    engine_config_from_args,
)
from kvserve.toolcalls import SYNTAXES as TOOL_SYNTAXES

if TYPE_CHECKING:
    from fastapi import FastAPI

    from kvserve.engine.client import AsyncEngineClient
    from kvserve.engine.core import EngineCore
    from kvserve.serving.engine_stats import EngineStats


logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve the model over HTTP (OpenAI Chat/Completions/Responses, Anthropic)"
    )
    add_serve_args(p)
    p.set_defaults(func=run)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The server and engine flags; also used by commands that embed a server (`cli/embedded.py`)."""
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer or x-api-key) on every route but /health",
    )
    g.add_argument("--cors", action="store_true", help="allow cross-origin requests from any origin")
    g.add_argument(
        "--served-model-name",
        default=None,
        help="model id shown by /v1/models (default: the --model value's name)",
    )
    g.add_argument(
        "--max-body-mb", type=_positive_int, default=64, help="largest request body; bigger ones get 413"
    )
    g.add_argument("--chdir", default=None, help="change to this directory before loading the model")
    g.add_argument(
        "--data-dir",
        default=None,
        help="where stored responses live (default $XDG_DATA_HOME/kvserve or ~/.local/share/kvserve)",
    )
    g.add_argument(
        "--tool-parser",
        default=None,
        choices=sorted(TOOL_SYNTAXES),
        help="tool-call syntax of the model's output (default: detected from the chat template)",
    )
    g.add_argument(
        "--disable-exact-tool-replay",
        action="store_true",
        help="render tool calls replayed in history canonically from their JSON, not as the exact text "
        "the model sampled (turn N+1 then misses the KV cache from the first such call on)",
    )
    g.add_argument(
        "--max-tokens-limit",
        type=_positive_int,
        default=None,
        help="cap every request's output tokens at N, whatever it asks for (like llama-server's "
        "--n-predict); a capped answer ends as the API's length stop (default: no cap, the context left)",
    )
    g.add_argument(
        "--default-temperature",
        type=_non_negative_float,
        default=None,
        help="sampling temperature of requests that send none (Claude Code and Codex never do; "
        "default 1.0, the APIs' own default; 0 = greedy)",
    )
    add_engine_args(p)
    add_kv_store_args(p)


def run(args: argparse.Namespace) -> None:
    import uvicorn

    app, engine = build_app(args)
    service = app.state.chat_service
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logger.warning("listening on %s without --api-key: anyone who can reach it can use it", args.host)
    logger.info(
        "kvserve: serving %s on http://%s:%d (ctx %d)",
        service.model_name,
        args.host,
        args.port,
        service.max_model_len,
    )
    # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it found:
    # make that one a clean exit, so the `finally` (the disk tier's shutdown save) runs.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_cleanly)
    if SWITCH_INTERVAL_MS:  # the engine thread and the event loop share the GIL (docs/benchmarks.md)
        sys.setswitchinterval(SWITCH_INTERVAL_MS / 1000)
    try:
        uvicorn.run(
            app, host=args.host, port=args.port, log_level=logging.getLogger().level, access_log=False
        )  # kvserve.access logs each request, with its id
    finally:
        logger.info("kvserve: shutting down")
        close_server(app, engine)


# Debug toggle for A/B runs of the GIL's switch interval (scripts/serve_e2e_bench.py); unset keeps
# Python's 5 ms, which beat 1 ms on the H200 at 256 streams.
SWITCH_INTERVAL_MS = float(os.environ.get("KVSERVE_SWITCH_INTERVAL_MS", "0"))


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def build_app(args: argparse.Namespace) -> tuple[FastAPI, AsyncEngineClient]:
    """Everything `run` serves, from the flags: --chdir first, then the model, engine and app."""
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.cli import console_sources
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.live_sequences import LiveSequences
    from kvserve.serving.response_store import ResponseStore
    from kvserve.serving.segmenter import OutputSyntax
    from kvserve.serving.tool_memory import ToolReplayMemory
    from kvserve.serving.tool_memory_file import ToolMemoryFile
    from kvserve.serving.turn_markers import turn_markers

    if args.chdir:
        try:
            os.chdir(args.chdir)
        except OSError as error:
            sys.exit(f"kvserve: --chdir {args.chdir}: {error.strerror}")
    core = build_engine(engine_config_from_args(args))
    engine = AsyncEngineClient(core)
    model_name = args.served_model_name or Path(args.model).stem
    syntax = OutputSyntax.detect(core.loaded.tokenizer.chat_template, args.tool_parser)
    logger.info("model output: %s", syntax.describe())
    if args.disable_exact_tool_replay:
        logger.info("exact tool replay is off: history tool calls render canonically from their JSON")
    service = ChatService(
        engine,
        core.loaded.tokenizer,
        core.max_model_len,
        model_name,
        segmenter_factory=syntax.segmenter,
        tool_memory=None if args.disable_exact_tool_replay else ToolReplayMemory(),
        live_sequences=LiveSequences(),
        tool_syntax=syntax.tool_parser,
        vocab_size=core.loaded.arch.vocab_size,
        reasoning_syntax=syntax.reasoning,
        prompt_prefix=core.disk_tier.text_prefix if core.disk_tier is not None else None,
        max_tokens_limit=args.max_tokens_limit,
        default_temperature=args.default_temperature,
    )
    if core.disk_tier is not None:
        tokenize = functools.partial(service.tokenize, add_special_tokens=False)
        core.disk_tier.turn_markers = turn_markers(service.renderer, tokenize)
    settings = ApiSettings(
        served_model_name=model_name,
        api_key=args.api_key,
        cors=args.cors,
        max_body_bytes=args.max_body_mb * 2**20,
    )
    store = ResponseStore(_data_dir(args.data_dir) / "responses.sqlite")
    console_sources.feed_prompt_sources(core, service.recorder)
    app = create_app(
        service,
        settings,
        response_store=store,
        engine_stats=lambda: _engine_stats(core),
        cache_view=console_sources.cache_source(core),
        checkpoint_tokens=lambda checkpoint_id: console_sources.checkpoint_tokens(core, checkpoint_id),
    )
    app.state.closers = []
    if core.disk_tier is not None and service.tool_memory is not None:
        # Exact replay after a restart needs the sampled call text beside the restored checkpoints
        # (in the model's own subdirectory: another model's server never overwrites it).
        memory_file = ToolMemoryFile(core.disk_tier.store.directory, service.tool_memory)
        memory_file.load()
        memory_file.start()
        app.state.closers.append(memory_file.close)
    return app, engine


def close_server(app: FastAPI, engine: AsyncEngineClient) -> None:
    """The clean shutdown of what `build_app` built: its savers, then the engine (whose disk tier
    writes the shutdown checkpoints)."""
    for close in getattr(app.state, "closers", ()):
        close()
    engine.shutdown()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _data_dir(flag: str | None) -> Path:
    if flag:
        return Path(flag).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "kvserve"


def _engine_stats(core: EngineCore) -> EngineStats:
    """Read from the HTTP thread while the engine thread runs: plain int/float reads, fine for metrics."""
    from kvserve.serving.engine_stats import DiskCacheStats, EngineStats

    disk = core.disk_tier.stats() if core.disk_tier is not None else None
    return EngineStats(
        core.scheduler.num_running,
        core.scheduler.num_waiting,
        core.kv_manager.usage,
        core.kv_manager.stats.hit_rate,
        disk=None if disk is None else DiskCacheStats(*dataclasses.astuple(disk)),
    )
