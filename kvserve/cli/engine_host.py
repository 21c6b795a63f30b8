"""Where `kvserve serve` runs the engine: in this process (an engine thread) or in a process of its
own (`engine.process_client`, the default on CUDA). Either way the server gets one
`EngineHandle`: the engine client `ChatService` drives, what the front end needs of the loaded model
(tokenizer, context, vocabulary, disk-tier directory), and the web console's and /metrics' sources,
which in the process case are typed queries (`EngineQuery`) answered by the engine process
(`answer_query`)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvserve.cli import console_sources
from kvserve.serving.cache_view import CacheView
from kvserve.serving.engine_stats import EngineStats
from kvserve.serving.request_recorder import PromptSource, RequestRecorder

if TYPE_CHECKING:
    from kvserve.config import EngineConfig
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.engine.client_protocol import EngineClient
    from kvserve.engine.core import EngineCore
    from kvserve.engine.process_client import EngineLink
    from kvserve.models.loaded import TokenizerInfo
    from kvserve.models.vision.image_prompt import ImagePromptSpec

logger = logging.getLogger(__name__)

TurnMarkers = tuple[Sequence[int], Sequence[int]]


@dataclass
class EngineHandle:
    client: EngineClient
    tokenizer: TokenizerInfo
    max_model_len: int
    vocab_size: int
    disk_dir: Path | None  # the disk tier's directory; None without one
    text_prefix: Callable[[str], tuple[list[int], int] | None] | None
    set_turn_markers: Callable[[TurnMarkers], None]
    feed_prompt_sources: Callable[[RequestRecorder], None]
    engine_stats: Callable[[], EngineStats]
    cache_view: Callable[[], CacheView]
    checkpoint_tokens: Callable[[str], Sequence[int] | None]
    in_process: bool
    image_prompt: ImagePromptSpec | None = None  # a vision model's prompt layout; None: text only

    def shutdown(self) -> None:
        self.client.shutdown()


def wants_engine_process(flag: str, config: EngineConfig) -> bool:
    """`--engine-process auto`: on for CUDA (the GIL is the bound there), off for CPU (whose step
    dwarfs the serving path's host cost) and for tensor parallelism (its ranks are the engine's
    own child processes)."""
    if flag != "auto":
        return flag == "on"
    if config.tensor_parallel_size > 1:
        return False
    device = config.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device.startswith("cuda")


def start_engine(config: EngineConfig, separate_process: bool, num_front_ends: int = 1) -> EngineHandle:
    """`num_front_ends` > 1 (the engine process only): the handle's client also holds the other
    front ends' pipes (`peer_conns`), for the processes `kvserve serve --api-servers` starts."""
    if separate_process:
        from kvserve.engine.process_client import ProcessEngineClient

        build = functools.partial(build_warm_engine, config)
        return link_handle(ProcessEngineClient(build, answer_query, num_front_ends=num_front_ends))
    assert num_front_ends == 1, "several API front ends need the engine in its own process"
    from kvserve.engine.client import AsyncEngineClient

    # Built on the engine thread: see kvserve/openmp.py.
    return _thread_handle(AsyncEngineClient(build=functools.partial(build_warm_engine, config)))


def build_warm_engine(config: EngineConfig) -> EngineCore:
    """The engine, with Triton's kernels compiled for a server's first batches on CUDA (warmup.py)."""
    from kvserve.engine.build import build_engine
    from kvserve.engine.warmup import warm_up

    core = build_engine(config)
    warm_up(core)
    return core


def _thread_handle(client: AsyncEngineClient) -> EngineHandle:
    from kvserve.models.vision.image_prompt import image_prompt_spec

    core = client.core
    disk = core.disk_tier

    def set_turn_markers(markers: TurnMarkers) -> None:
        if disk is not None:
            disk.turn_markers = markers

    return EngineHandle(
        client=client,
        tokenizer=core.loaded.tokenizer,
        max_model_len=core.max_model_len,
        vocab_size=core.loaded.arch.vocab_size,
        disk_dir=None if disk is None else Path(disk.store.directory),
        text_prefix=None if disk is None else disk.text_prefix,
        set_turn_markers=set_turn_markers,
        feed_prompt_sources=lambda recorder: console_sources.feed_prompt_sources(core, recorder),
        engine_stats=lambda: engine_stats(core),
        cache_view=console_sources.cache_source(core),
        checkpoint_tokens=lambda checkpoint_id: console_sources.checkpoint_tokens(core, checkpoint_id),
        in_process=True,
        image_prompt=image_prompt_spec(
            core.loaded.arch.vision, core.loaded.path, core.loaded.image_processor
        ),
    )


def link_handle(client: EngineLink) -> EngineHandle:
    """The handle of a front end whose engine is another process (`ProcessEngineClient`, or the
    `EngineLink` of a front-end process `serve --api-servers` started)."""
    info = client.info

    def feed(recorder: RequestRecorder) -> None:
        def on_source(request_id: str, num_ram: int, num_disk: int, checkpoint_id: str | None) -> None:
            recorder.note_source(request_id, PromptSource(num_ram, num_disk, checkpoint_id))

        client.on_source = on_source

    has_disk = info.disk_dir is not None
    return EngineHandle(
        client=client,
        tokenizer=info.tokenizer,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        disk_dir=Path(info.disk_dir) if has_disk else None,
        text_prefix=(lambda text: client.query(TextPrefixQuery(text))) if has_disk else None,
        set_turn_markers=lambda markers: client.query(SetTurnMarkers(markers)) if has_disk else None,
        feed_prompt_sources=feed,
        engine_stats=lambda: client.query(EngineStatsQuery()),
        cache_view=lambda: client.query(CacheViewQuery()),
        checkpoint_tokens=lambda checkpoint_id: client.query(CheckpointTokensQuery(checkpoint_id)),
        in_process=False,
        image_prompt=info.image_prompt,
    )


def engine_stats(core: EngineCore) -> EngineStats:
    """Read off the engine thread while it runs: plain int/float reads, fine for metrics."""
    from kvserve.serving.engine_stats import DiskCacheStats, EncoderCacheStats

    disk = core.disk_tier.stats() if core.disk_tier is not None else None
    encoder = core.encoder_cache.stats() if core.encoder_cache is not None else None
    return EngineStats(
        core.scheduler.num_running,
        core.scheduler.num_waiting,
        core.kv_manager.usage,
        core.kv_manager.stats.hit_rate,
        disk=None if disk is None else DiskCacheStats(*dataclasses.astuple(disk)),
        encoder_cache=None if encoder is None else EncoderCacheStats(*dataclasses.astuple(encoder)),
    )


# -- the engine process's side of `EngineHandle`'s sources -----------------------------------


@dataclass(frozen=True, slots=True)
class EngineStatsQuery:
    """Answered with the engine's `EngineStats` (/metrics)."""


@dataclass(frozen=True, slots=True)
class CacheViewQuery:
    """Answered with the web console's `CacheView` of the KV cache."""


@dataclass(frozen=True, slots=True)
class CheckpointTokensQuery:
    """Answered with a disk checkpoint's token ids (None when it is not stored)."""

    checkpoint_id: str


@dataclass(frozen=True, slots=True)
class TextPrefixQuery:
    """Answered with `DiskTier.text_prefix(text)`: the stored checkpoint whose text is the longest
    prefix of `text` (its token ids and that prefix's length in UTF-8 bytes), or None."""

    text: str


@dataclass(frozen=True, slots=True)
class SetTurnMarkers:
    """Sets the turn markers the disk tier cuts its checkpoints at; answered with None."""

    markers: TurnMarkers


EngineQuery = EngineStatsQuery | CacheViewQuery | CheckpointTokensQuery | TextPrefixQuery | SetTurnMarkers

_cache_sources: dict[int, Callable[[], CacheView]] = {}


def answer_query(core: EngineCore, query: EngineQuery) -> Any:
    """The answer to `query`, in the engine process (on a query thread of its own)."""
    disk = core.disk_tier
    match query:
        case EngineStatsQuery():
            return engine_stats(core)
        case CacheViewQuery():
            if id(core) not in _cache_sources:  # one DiskViewCache for the engine's life
                _cache_sources[id(core)] = console_sources.cache_source(core)
            return _cache_sources[id(core)]()
        case CheckpointTokensQuery(checkpoint_id=checkpoint_id):
            return console_sources.checkpoint_tokens(core, checkpoint_id)
        case TextPrefixQuery(text=text):
            return None if disk is None else disk.text_prefix(text)
        case SetTurnMarkers(markers=markers):
            if disk is not None:
                disk.turn_markers = markers
            return None
        case _:
            raise LookupError(f"unknown engine query {query!r}")
