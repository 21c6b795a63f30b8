"""The web console's engine-side data on a tiny model: the disk tier reports each admitted prompt's
source (RAM, disk checkpoint, cold), and the cache view reads the pool and the checkpoints."""

from __future__ import annotations

import random
from pathlib import Path

from kvserve.cli.console_sources import cache_source, feed_prompt_sources
from kvserve.config import KVStoreConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.serving.request_recorder import PromptSource, RequestRecorder
from tests.engine.conftest import VOCAB, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


class Recorder(RequestRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[str, PromptSource] = {}

    def note_source(self, request_id: str, source: PromptSource) -> None:
        self.sources[request_id] = source


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _run(engine: EngineCore, prompt: list[int], request_id: str) -> None:
    engine.generate([engine.make_request(request_id, prompt, GREEDY)])


def test_prompt_sources_and_cache_view(tiny_llama_dir: Path, tmp_path: Path) -> None:
    store = KVStoreConfig(directory=str(tmp_path / "kv"), preload_fraction=0.0)  # sources of a disk hit
    base = _prompt(600, 1)
    first = make_engine(tiny_llama_dir, kv_store=store)
    recorder = Recorder()
    feed_prompt_sources(first, recorder)
    _run(first, base, "cold")
    _run(first, base + _prompt(20, 2), "ram")
    assert recorder.sources["cold"] == PromptSource(0, 0, None)
    assert (
        recorder.sources["ram"].num_ram_tokens == 600 // 16 * 16
        and recorder.sources["ram"].num_disk_tokens == 0
    )
    first.shutdown()

    second = make_engine(tiny_llama_dir, kv_store=store)  # a restart: the prefix is on disk only
    feed_prompt_sources(second, recorder)
    _run(second, base + _prompt(20, 3), "disk")
    source = recorder.sources["disk"]
    assert source.num_ram_tokens == 0 and source.num_disk_tokens >= 512
    assert second.disk_tier is not None
    stored = {c.checkpoint_id for c in second.disk_tier.store.checkpoints()}
    assert source.checkpoint_id in stored

    view = cache_source(second)()
    assert view.pool.block_size == 16 and view.pool.num_cached_blocks > 0
    assert view.pool.num_used_blocks == 0  # nothing in flight
    assert view.disk is not None and {c.checkpoint_id for c in view.disk.checkpoints} == stored
    assert all(c.score > 0 and c.marginal_bytes > 0 for c in view.disk.checkpoints)
    second.shutdown()
