"""The disk KV tier wired into EngineCore (tiny random llama, CPU): a prefix loaded from disk
gives the same greedy tokens as a cold run, each save trigger, disabled and unusable dirs."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
import time
from pathlib import Path

from kvserve.config import EngineConfig, KVStoreConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.kvstore.chunk_format import chunk_file_size
from kvserve.models.rope_scaling import ContextRequest
from tests.engine.conftest import VOCAB, load_tiny, make_engine
from tests.serve_process import child_env

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _store_config(directory: Path, **overrides: float) -> KVStoreConfig:
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
    store = _store_config(tmp_path / "kv", preload_fraction=0.0)  # the request's own disk load
    first = make_engine(tiny_llama_dir, kv_store=store)
    base = _prompt(1200, 1)
    _run(first, base)
    first.shutdown()
    follow_up = base + _prompt(60, 2)

    second = make_engine(tiny_llama_dir, kv_store=store)  # a restart over the same directory
    assert second.disk_tier is not None and second.disk_tier.store.identity.dtype == "float16"  # fp32 engine
    tokens, request = _run(second, follow_up)
    assert request.num_cached_tokens >= 1200 // 16 * 16
    assert second.disk_tier is not None and second.disk_tier.stats().num_hits == 1
    cold, cold_request = _run(make_engine(tiny_llama_dir), follow_up)
    assert cold_request.num_cached_tokens == 0
    assert tokens == cold
    second.shutdown()


def test_restart_preloads_the_latest_checkpoint_into_ram(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """At start-up the stored KV goes into the RAM pool: the first request after a restart hits RAM
    (no disk load on its path) and still gives the cold run's tokens."""
    store = _store_config(tmp_path / "kv")
    first = make_engine(tiny_llama_dir, kv_store=store)
    base = _prompt(1200, 3)
    _run(first, base)
    first.shutdown()

    second = make_engine(tiny_llama_dir, kv_store=store)
    assert second.disk_tier is not None
    preloaded = second.kv_manager.pool.num_cached_blocks
    assert preloaded * 16 >= 1200 // 256 * 256  # whole chunks of the shutdown checkpoint
    follow_up = base + _prompt(60, 4)
    tokens, request = _run(second, follow_up)
    assert request.num_cached_tokens >= 1200 // 256 * 256
    assert second.disk_tier.stats().num_hits == 0  # found in RAM
    assert tokens == _run(make_engine(tiny_llama_dir), follow_up)[0]
    second.shutdown()

    budget = _store_config(tmp_path / "kv", preload_fraction=1e-6)  # too small for any checkpoint
    third = make_engine(tiny_llama_dir, kv_store=budget)
    assert third.kv_manager.pool.num_cached_blocks == 0
    third.shutdown()


def test_rope_scaling_is_part_of_the_cache_identity(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """KV computed under other RoPE never mixes: YaRN (--ctx past the trained 2048) is another cache
    key, so neither the RAM block hashes nor the disk store (its own subdirectory) match."""
    store = _store_config(tmp_path / "kv")
    prompt = _prompt(1200, 3)
    plain = make_engine(tiny_llama_dir, kv_store=store)
    _run(plain, prompt)
    plain.shutdown()
    yarn = make_engine(tiny_llama_dir, kv_store=store, context=ContextRequest(max_model_len=4096))
    assert yarn.loaded.arch.rope_scaling_dict == {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 2048,
    }
    assert yarn.cache_key != plain.cache_key and yarn.max_model_len == 4096
    _, request = _run(yarn, prompt)
    assert request.num_cached_tokens == 0
    yarn.shutdown()
    again = make_engine(tiny_llama_dir, kv_store=store, context=ContextRequest(max_model_len=4096))
    assert again.cache_key == yarn.cache_key
    _, request = _run(again, prompt)
    assert request.num_cached_tokens >= 1024  # its own checkpoint, from disk
    again.shutdown()


def test_cold_checkpoint_after_a_first_prefill(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = make_engine(tiny_llama_dir, kv_store=_store_config(tmp_path, align_tokens=256))
    request = engine.make_request("r", _prompt(700, 3), GREEDY)
    outputs = engine.generate([request])["r"]
    assert outputs[-1].num_cache_write_tokens == 512  # reported as cache writes (Anthropic usage)
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
    engine = make_engine(
        tiny_llama_dir, kv_cache_memory_mb=1, kv_store=_store_config(tmp_path), kv_dtype="float32"
    )
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
    # The text lookup: the longest checkpoint whose rendered text prefixes a prompt.
    disk = reopened.disk_tier
    assert disk is not None
    longest = max(disk.store.checkpoints(), key=lambda c: c.meta.num_tokens)
    stored = disk.store.token_ids(longest)
    assert stored is not None and len(stored) == longest.meta.num_tokens
    text = disk.text_of(stored)
    assert disk.text_prefix(text + "<1><2>") == (stored, len(text.encode()))
    assert disk.text_prefix("<1><2>") is None


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


def test_three_conversations_store_their_shared_prefix_once(tiny_llama_dir: Path, tmp_path: Path) -> None:
    loaded = dataclasses.replace(load_tiny(tiny_llama_dir), max_model_len=4096)
    config = EngineConfig(
        model=str(tiny_llama_dir),
        dtype="float32",
        device="cpu",
        max_model_len=4096,
        scheduler=SchedulerConfig(max_num_batched_tokens=512),
        kv_store=_store_config(tmp_path),
    )
    engine = EngineCore(config, loaded)
    assert engine.disk_tier is not None
    user, assistant = [VOCAB - 2], [VOCAB - 1]  # turn-start markers (never in the random text)
    engine.disk_tier.turn_markers = (user, assistant)
    system = [t % (VOCAB - 2) for t in _prompt(3000, 20)]
    for i in range(3):
        question = [t % (VOCAB - 2) for t in _prompt(400, 30 + i)]
        _run(engine, system + user + question + assistant, f"c{i}")
    engine.shutdown()

    store = engine.disk_tier.store
    chunk_dir = store.directory / "chunks"
    reopened = make_engine(tiny_llama_dir, kv_store=_store_config(tmp_path))
    checkpoints = reopened.disk_tier.store.checkpoints()  # type: ignore[union-attr]
    # The first conversation's `cold` checkpoint is the system prefix (cut at the user turn,
    # block aligned); the others found it in RAM. Shutdown stored each whole conversation.
    assert sorted(c.meta.reason for c in checkpoints) == ["cold", "shutdown", "shutdown", "shutdown"]
    assert [c.meta.num_tokens for c in checkpoints if c.meta.reason == "cold"] == [2992]
    shared = {s.key for c in checkpoints for s in c.chunks if s.end <= 2816}  # 11 whole chunks of 256
    assert len(shared) == 11 and all(len([s for s in c.chunks if s.key in shared]) == 11 for c in checkpoints)
    on_disk = sorted(chunk_dir.glob("*.kvc"))
    distinct = {s.key for c in checkpoints for s in c.chunks}
    assert len(on_disk) == len(distinct)  # one file per distinct chunk
    disk_bytes = sum(p.stat().st_size for p in on_disk)
    chunk_size = chunk_file_size(store.identity, 256)
    # Stored once: the sum over checkpoints would count the 11 shared chunks 4 times.
    assert sum(c.num_bytes - c.manifest_bytes for c in checkpoints) - disk_bytes == 3 * 11 * chunk_size


def test_kill_9_during_checkpoint_writes_never_leaves_a_corrupt_entry(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL a writing process at random points until 50 saves have been started; the store
    then verifies clean, and an engine over it serves from disk with the cold run's tokens."""
    cache = tmp_path / "kv"
    rng = random.Random(0)
    env = child_env()
    num_started = kills = 0
    while num_started < 50:  # a few lives, each killed after ~17 saves (startup is the slow part)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.engine.disk_crash_worker",
                str(tiny_llama_dir),
                str(cache),
                str(kills),
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None
        for _ in range(rng.randint(14, 20)):  # let it write some, then kill it mid-way through one
            assert worker.stdout.readline(), "the worker died on its own"
            num_started += 1
        time.sleep(rng.uniform(0.0, 0.05))
        worker.kill()
        worker.wait()
        kills += 1
    assert kills >= 3

    config = _store_config(cache)
    engine = make_engine(tiny_llama_dir, kv_store=config)  # opening repairs: temp files, orphans
    store = engine.disk_tier.store  # type: ignore[union-attr]
    assert store.verify() == 0  # every checkpoint left reads back with valid hashes
    verify = subprocess.run(
        [sys.executable, "-m", "kvserve", "kv", "verify", "--kv-cache-dir", str(cache)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr  # the CLI agrees, beside the open store
    checkpoints = store.checkpoints()
    assert checkpoints and not list(cache.rglob("*.tmp.*"))
    stored = store.token_ids(checkpoints[0])
    assert stored is not None
    prompt = stored + _prompt(30, 99)
    tokens, request = _run(engine, prompt)
    assert request.num_cached_tokens == len(stored)
    assert tokens == _run(make_engine(tiny_llama_dir), prompt)[0]
