"""The shared KV tier wired into two EngineCores (tiny random llama, CPU), each with its own local
disk tier over one shared directory: a conversation prefilled on replica A is loaded by replica B
(started before A wrote it) and gives B the cold run's tokens; every finished turn is published."""

from __future__ import annotations

import random
from pathlib import Path

from kvserve.config import KVStoreConfig, SharedKVConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.disk_tier import DiskTier
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _replica(model: Path, local: Path, shared: Path) -> EngineCore:
    config = KVStoreConfig(
        directory=str(local), preload_fraction=0.0, shared=SharedKVConfig(str(shared), miss_refresh_s=0.0)
    )
    return make_engine(model, kv_store=config)


def _tier(engine: EngineCore) -> DiskTier:
    tier = engine.disk_tier
    assert isinstance(tier, DiskTier) and tier.shared is not None
    return tier


def _flush(engine: EngineCore) -> None:
    tier = _tier(engine)
    tier.writer.flush()
    tier.shared.flush()


def _run(
    engine: EngineCore, prompt: list[int], request_id: str, params: SamplingParams = GREEDY
) -> tuple[list[int], int]:
    request = engine.make_request(request_id, prompt, params)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request.num_cached_tokens


def test_a_turn_prefilled_on_one_replica_continues_on_another(tiny_llama_dir: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    a = _replica(tiny_llama_dir, tmp_path / "a", shared)
    b = _replica(tiny_llama_dir, tmp_path / "b", shared)  # up before A writes anything
    first_turn = _prompt(1200, 1)
    reply, cached = _run(a, first_turn, "a1", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert cached == 0
    _flush(a)
    assert _tier(a).shared.stats().num_published >= 1

    # The next turn (prompt + reply + a new message) lands on B: its prefix comes from the shared tier.
    next_turn = first_turn + reply + _prompt(60, 2)
    tokens, cached = _run(b, next_turn, "b1")
    assert cached == (1200 + 39) // 16 * 16  # the finished turn's checkpoint, not just the cold one
    stats = _tier(b).stats()
    assert stats.num_shared_hits == 1 and stats.num_hits == 0
    cold, cold_cached = _run(make_engine(tiny_llama_dir), next_turn, "cold")
    assert cold_cached == 0 and tokens == cold
    a.shutdown()
    b.shutdown()


def test_without_a_reachable_shared_tier_the_disk_tier_serves_alone(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    unreachable = SharedKVConfig("s3://kvserve-test/x", endpoint_url="http://127.0.0.1:9")
    config = KVStoreConfig(directory=str(tmp_path / "local"), shared=unreachable)
    engine = make_engine(tiny_llama_dir, kv_store=config)
    tier = engine.disk_tier
    assert isinstance(tier, DiskTier) and tier.shared is None and not tier.save_turns
    _run(engine, _prompt(600, 3), "r")
    engine.shutdown()
