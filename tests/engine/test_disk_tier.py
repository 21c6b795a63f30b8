"""The disk KV tier wired into EngineCore (tiny random llama, CPU): a prefix loaded from disk
gives the same greedy tokens as a cold run, each save trigger, disabled and unusable dirs."""

from __future__ import annotations

import random
from pathlib import Path

from kvserve.config import KVStoreConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _store_config(directory: Path, **overrides: int) -> KVStoreConfig:
    return KVStoreConfig(directory=str(directory), **overrides)  # type: ignore[arg-type]


def _run(engine: EngineCore, prompt: list[int], request_id: str = "r", params: SamplingParams = GREEDY):
    request = engine.make_request(request_id, prompt, params)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request


def _reasons(engine: EngineCore) -> list[str]:
    assert engine.disk_tier is not None
    engine.disk_tier.writer.flush()
    return sorted(c.meta.reason for c in engine.disk_tier.store.checkpoints())


def test_prefix_loaded_from_disk_gives_the_cold_run_tokens(tiny_llama_dir: Path, tmp_path: Path) -> None:
    store = _store_config(tmp_path / "kv")
    first = make_engine(tiny_llama_dir, kv_store=store)
    base = _prompt(1200, 1)
    _run(first, base)
    first.shutdown()
    follow_up = base + _prompt(60, 2)

    second = make_engine(tiny_llama_dir, kv_store=store)  # a restart over the same directory
    tokens, request = _run(second, follow_up)
    assert request.num_cached_tokens >= 1200 // 16 * 16
    assert second.disk_tier is not None and second.disk_tier.stats().num_hits == 1
    cold, cold_request = _run(make_engine(tiny_llama_dir), follow_up)
    assert cold_request.num_cached_tokens == 0
    assert tokens == cold
    second.shutdown()


def test_cold_checkpoint_after_a_first_prefill(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = make_engine(tiny_llama_dir, kv_store=_store_config(tmp_path, align_tokens=256))
    _run(engine, _prompt(700, 3))
    assert _reasons(engine) == ["cold"]
    (checkpoint,) = engine.disk_tier.store.checkpoints()  # type: ignore[union-attr]
    assert checkpoint.meta.num_tokens == 512  # (700 - 32) aligned down to 256
    _run(engine, _prompt(300, 4), "short")  # under min_tokens: nothing stored
    assert _reasons(engine) == ["cold"]


def test_continued_checkpoints_at_absolute_frontiers(tiny_llama_dir: Path, tmp_path: Path) -> None:
    config = _store_config(tmp_path, align_tokens=256, continued_interval_tokens=512)
    engine = make_engine(tiny_llama_dir, kv_store=config)
    long_run = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    _run(engine, _prompt(1100, 5), params=long_run)  # prefill crosses 512 and 1024, decode 1536
    engine.disk_tier.writer.flush()  # type: ignore[union-attr]
    checkpoints = engine.disk_tier.store.checkpoints()  # type: ignore[union-attr]
    continued = sorted(c.meta.num_tokens for c in checkpoints if c.meta.reason == "continued")
    assert continued == [512, 1024, 1536]
    # The cold cut ((1100 - 32) aligned down to 256 = 1024) is the 1024 frontier: stored once.
    assert len(checkpoints) == 3


def test_evict_saves_a_released_sequence_before_its_blocks_are_reused(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    # A pool of 129 blocks (the floor for one 2048-token context): B's prefill reuses A's blocks.
    engine = make_engine(tiny_llama_dir, kv_cache_memory_mb=1, kv_store=_store_config(tmp_path))
    assert engine.num_blocks == 129
    a = _prompt(1000, 6)
    _run(engine, a, "a", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert _reasons(engine) == ["cold"]  # the prompt's 992 full-block tokens
    _run(engine, _prompt(1500, 7), "b")
    assert _reasons(engine) == ["cold", "cold", "evict"]
    store = engine.disk_tier.store  # type: ignore[union-attr]
    (evicted,) = [c for c in store.checkpoints() if c.meta.reason == "evict"]
    assert evicted.meta.num_tokens == (1000 + 40 - 1) // 16 * 16  # prompt + output, full blocks
    # A comes back from disk, not from a recompute.
    _, again = _run(engine, a + _prompt(20, 8), "a2")
    assert again.num_cached_tokens == 992
    assert engine.disk_tier.stats().num_hits >= 1  # type: ignore[union-attr]


def test_shutdown_saves_the_live_sequences(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = make_engine(tiny_llama_dir, kv_store=_store_config(tmp_path))
    _run(engine, _prompt(400, 9) + _prompt(300, 10), "a")  # 700 tokens: cold stores all (no align room)
    engine.shutdown()
    engine.shutdown()  # idempotent
    reopened = make_engine(tiny_llama_dir, kv_store=_store_config(tmp_path))
    reasons = _reasons(reopened)
    assert "shutdown" in reasons and "cold" in reasons


def test_disabled_and_unusable_directories_serve_without_the_tier(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    off = make_engine(tiny_llama_dir)
    assert off.disk_tier is None
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    engine = make_engine(tiny_llama_dir, kv_store=_store_config(blocker / "kv"))
    assert engine.disk_tier is None
    tokens, _ = _run(engine, _prompt(600, 11))
    assert tokens == _run(off, _prompt(600, 11))[0]
    engine.shutdown()
