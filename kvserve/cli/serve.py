"""`kvserve serve`: the OpenAI + Anthropic compatible HTTP server over one engine."""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.chat.image_limits import DEFAULT_LIMITS, ImageLimits
from kvserve.cli.engine_args import (
    add_engine_args,
    add_kv_store_args,
    engine_config_from_args,
)
from kvserve.env import switches
from kvserve.models.generation_config import (
    GENERATION_CONFIG_MODES,
    GenerationConfigError,
    SamplingDefaults,
    parse_overrides,
)
from kvserve.toolcalls import SYNTAXES as TOOL_SYNTAXES

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess
    from multiprocessing.synchronize import Event as EventType

    from fastapi import FastAPI

    from kvserve.cli.engine_host import EngineHandle
    from kvserve.engine.client_protocol import EngineClient
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
    g.add_argument(
        "--max-images-per-request",
        type=_positive_int,
        default=DEFAULT_LIMITS.max_images_per_request,
        help="images one request may carry, tool results included; more get a 400",
    )
    g.add_argument(
        "--max-image-pixels",
        type=_positive_int,
        default=DEFAULT_LIMITS.max_image_pixels,
        help="width x height of one image, checked before decoding; bigger ones get a 400",
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
        "--generation-config",
        choices=GENERATION_CONFIG_MODES,
        default="auto",
        help="sampling defaults for what a request leaves out (Claude Code and Codex send no "
        "temperature): auto = the model's own (generation_config.json, GGUF general.sampling.*), "
        "else kvserve's preset for a model it installs, else llama.cpp's (temperature 0.8, top-k 40, "
        "top-p 0.95, min-p 0.05); none = the APIs' own (temperature 1.0, no filters). Shown at "
        "start-up and in /v1/models",
    )
    g.add_argument(
        "--override-generation-config",
        type=_generation_overrides,
        default={},
        metavar="JSON",
        help="sampling defaults that win over --generation-config's, e.g. "
        '\'{"temperature": 0.2, "repetition_penalty": 1.1, "repetition_last_n": 64}\' '
        "(a request's own values still win)",
    )
    g.add_argument(
        "--default-temperature",
        type=_non_negative_float,
        default=None,
        help="shorthand for --override-generation-config '{\"temperature\": T}' (0 = greedy)",
    )
    g.add_argument(
        "--engine-process",
        choices=["auto", "on", "off"],
        default="auto",
        help="run the engine in a process of its own, the HTTP front end in this one (auto: on for "
        "CUDA, where the event loop and the engine thread would share one GIL; off for CPU and TP)",
    )
    g.add_argument(
        "--api-servers",
        default="auto",
        metavar="N|auto",
        help="API front-end processes sharing the listening socket and the one engine process, like "
        "vLLM's --api-server-count (auto: one per 4 cores, at most 2, with the engine process; else 1)",
    )
    add_engine_args(p)
    add_kv_store_args(p)


def run(args: argparse.Namespace) -> None:
    app, engine = build_app(args)
    service = app.state.chat_service
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logger.warning("listening on %s without --api-key: anyone who can reach it can use it", args.host)
    logger.info(
        "kvserve: serving %s on http://%s:%d (ctx %d)",
        service.settings.model_name,
        args.host,
        args.port,
        service.settings.max_model_len,
    )
    # uvicorn stops gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it found:
    # make that one a clean exit, so the `finally` (the disk tier's shutdown save) runs.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, exit_cleanly)
    switch_interval_ms = switches().switch_interval_ms
    if switch_interval_ms:  # the engine thread and the event loop share the GIL (docs/benchmarks/history.md)
        sys.setswitchinterval(switch_interval_ms / 1000)
    peer_conns = getattr(engine, "peer_conns", [])
    front_ends = sock = None
    try:
        if peer_conns:
            from kvserve.cli.api_servers import bind

            sock = bind(args.host, args.port)
            front_ends = FrontEnds(args, peer_conns, sock)
        serve_forever(app, args, sock)
    finally:
        logger.info("kvserve: shutting down")
        if front_ends is not None:
            front_ends.stop()
        close_server(app, engine)


def serve_forever(app: FastAPI, args: argparse.Namespace, sock: socket.socket | None = None) -> None:
    """uvicorn until SIGINT/SIGTERM; on `sock` if given (`api_servers.bind`)."""
    import uvicorn

    from kvserve.api.http_server import server_config

    server = uvicorn.Server(server_config(app, args.host, args.port, logging.getLogger().level))
    # The app, tokenizer and templates live as long as the process: leave them out of the
    # collector's full passes, which otherwise walk them while streams allocate per token.
    gc.collect()
    gc.freeze()
    server.run(sockets=None if sock is None else [sock])
    if not server.started:  # e.g. the port is taken (uvicorn.run's exit status)
        sys.exit(3)


def exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def build_app(args: argparse.Namespace) -> tuple[FastAPI, EngineClient]:
    """Everything `run` serves, from the flags: --chdir first, then the model, engine and app."""
    from kvserve.cli.api_servers import api_server_count
    from kvserve.cli.engine_host import start_engine, wants_engine_process
    from kvserve.engine.process_client import EngineStartError

    if args.chdir:
        try:
            os.chdir(args.chdir)
        except OSError as error:
            sys.exit(f"kvserve: --chdir {args.chdir}: {error.strerror}")
    config = engine_config_from_args(args)
    separate = wants_engine_process(getattr(args, "engine_process", "auto"), config)
    num_front_ends = api_server_count(getattr(args, "api_servers", "1"), separate, config)
    try:
        handle = start_engine(config, separate, num_front_ends)
    except EngineStartError as error:
        sys.exit(f"kvserve: {error}")
    if separate:
        logger.info("engine: in its own process (--engine-process)")
    return build_app_over(args, handle)


def build_app_over(
    args: argparse.Namespace, handle: EngineHandle, index: int = 0
) -> tuple[FastAPI, EngineClient]:
    """The app of API front end `index` over a started engine (`build_app`; `api_servers.py`)."""
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.cli.api_servers import wire_front_end
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings
    from kvserve.serving.live_sequences import LiveSequences
    from kvserve.serving.response_store import ResponseStore
    from kvserve.serving.segmenter import OutputSyntax
    from kvserve.serving.tool_memory import ToolReplayMemory
    from kvserve.serving.tool_memory_file import ToolMemoryFile
    from kvserve.serving.turn_markers import turn_markers

    engine = handle.client
    model_name = args.served_model_name or Path(args.model).stem
    syntax = OutputSyntax.detect(handle.tokenizer.chat_template, args.tool_parser)
    logger.info("model output: %s", syntax.describe())
    if args.disable_exact_tool_replay:
        logger.info("exact tool replay is off: history tool calls render canonically from their JSON")
    chat_settings = ChatServiceSettings(
        model_name=model_name,
        max_model_len=handle.max_model_len,
        segmenter_factory=syntax.segmenter,
        tool_syntax=syntax.tool_parser,
        reasoning_syntax=syntax.reasoning,
        vocab_size=handle.vocab_size,
        max_tokens_limit=args.max_tokens_limit,
        sampling_defaults=sampling_defaults_from_args(args),
        supports_images=handle.image_prompt is not None,
        image_prompt=handle.image_prompt,
    )
    service = ChatService(
        engine,
        handle.tokenizer,
        chat_settings,
        tool_memory=None if args.disable_exact_tool_replay else ToolReplayMemory(),
        live_sequences=LiveSequences(),
        prompt_prefix=handle.text_prefix,
    )
    if handle.disk_dir is not None and index == 0:
        tokenize = functools.partial(service.tokenize, add_special_tokens=False)
        handle.set_turn_markers(turn_markers(service.renderer, tokenize))
    settings = ApiSettings(
        served_model_name=model_name,
        api_key=args.api_key,
        cors=args.cors,
        max_body_bytes=args.max_body_mb * 2**20,
        image_limits=ImageLimits(args.max_images_per_request, args.max_image_pixels),
        response_id_prefix=getattr(args, "response_id_prefix", "resp_"),  # set by cluster replicas
    )
    store = ResponseStore(_data_dir(args.data_dir) / "responses.sqlite")
    handle.feed_prompt_sources(service.recorder)
    app = create_app(
        service,
        settings,
        response_store=store,
        engine_stats=handle.engine_stats,
        cache_view=handle.cache_view,
        checkpoint_tokens=handle.checkpoint_tokens,
    )
    if getattr(engine, "num_front_ends", 1) > 1:
        wire_front_end(app, engine, index)
    app.state.closers = []
    if handle.disk_dir is not None and service.tool_memory is not None and index == 0:
        # Exact replay after a restart needs the sampled call text beside the restored checkpoints
        # (in the model's own subdirectory: another model's server never overwrites it).
        memory_file = ToolMemoryFile(handle.disk_dir, service.tool_memory)
        memory_file.load()
        memory_file.start()
        app.state.closers.append(memory_file.close)
    return app, engine


def sampling_defaults_from_args(args: argparse.Namespace) -> SamplingDefaults:
    """What requests that leave a sampling parameter out get (models/generation_config.py), logged."""
    from kvserve.models.aliases import sampling_preset
    from kvserve.models.generation_config import read_model_sampling, resolve_sampling_defaults
    from kvserve.models.loader.paths import resolve_model_path

    mode = getattr(args, "generation_config", "auto")
    overrides = dict(getattr(args, "override_generation_config", {}))
    if args.default_temperature is not None:
        overrides["temperature"] = args.default_temperature
    model_values, model_source = read_model_sampling(resolve_model_path(args.model))
    preset = sampling_preset(args.model)
    defaults = resolve_sampling_defaults(
        mode,
        model_values,
        model_source,
        preset.values if preset else {},
        preset.source if preset else "",
        overrides,
    )
    logger.info("sampling defaults (--generation-config %s): %s", mode, defaults.describe())
    return defaults


def close_server(app: FastAPI, engine: EngineClient) -> None:
    """The clean shutdown of what `build_app` built: its savers, then the engine (whose disk tier
    writes the shutdown checkpoints)."""
    for close in getattr(app.state, "closers", ()):
        close()
    engine.shutdown()


class FrontEnds:
    """Front ends 1..N-1 (processes), started with their pipes and the port of front end 0's socket."""

    def __init__(self, args: argparse.Namespace, conns: list[Connection], sock: socket.socket):
        args = argparse.Namespace(**{**vars(args), "port": sock.getsockname()[1]})
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        level = logging.getLogger().getEffectiveLevel()
        self.stopping = False
        self.processes: list[BaseProcess] = []
        readies = []
        for index, conn in enumerate(conns, start=1):
            ready = context.Event()
            process = context.Process(
                target=front_end_main,
                args=(args, conn, index, level, ready),
                name=f"kvserve-api-{index}",
                daemon=True,
            )
            process.start()
            conn.close()  # the child holds it now: its death must close the engine's end
            self.processes.append(process)
            readies.append(ready)
            threading.Thread(target=self._watch, args=(index, process), daemon=True).start()
        # Serve only once all listen: a burst of clients at the start would find front end 0 alone.
        for process, ready in zip(self.processes, readies, strict=True):
            while not ready.wait(1.0) and process.is_alive():
                pass
        logger.info(
            "API front ends: %d processes over one engine (--api-servers): pids %s",
            len(conns) + 1,
            " ".join(str(p) for p in [os.getpid(), *(p.pid for p in self.processes)]),
        )

    def _watch(self, index: int, process: BaseProcess) -> None:
        process.join()
        if not self.stopping:
            logger.error(
                "API front end %d exited with %s; its requests were aborted, the others go on",
                index,
                process.exitcode,
            )

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping = True
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join(timeout)
            if process.is_alive():
                logger.warning(
                    "API front end %s still running after %.0f s; killing it", process.name, timeout
                )
                process.kill()
                process.join(5)


def front_end_main(
    args: argparse.Namespace, conn: Connection, index: int, level: int, ready: EventType
) -> None:
    """A front-end process: the server's app over its pipe to the engine, on the server's port."""
    from kvserve.cli.api_servers import bind
    from kvserve.cli.engine_host import link_handle
    from kvserve.engine.process_client import EngineLink

    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s %(name)s [api {index}]: %(message)s")
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, exit_cleanly)
    link = EngineLink(conn, start_timeout=600)
    # The engine went away (the server exited or failed): stop serving.
    link.on_dead = lambda why: os.kill(os.getpid(), signal.SIGTERM)
    app: FastAPI | None = None
    try:
        app = build_app_over(args, link_handle(link), index)[0]
        sock = bind(args.host, args.port)
        ready.set()
        serve_forever(app, args, sock)
    finally:
        if app is not None:
            close_server(app, link)
        else:
            link.shutdown()


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


def _generation_overrides(text: str) -> dict[str, float | int]:
    try:
        return parse_overrides(text)
    except GenerationConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _data_dir(flag: str | None) -> Path:
    if flag:
        return Path(flag).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "kvserve"


def _engine_stats(core: EngineCore) -> EngineStats:
    from kvserve.cli.engine_host import engine_stats

    return engine_stats(core)
