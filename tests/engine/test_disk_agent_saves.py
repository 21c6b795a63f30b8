"""The agent's explicit checkpoints (a request's CheckpointHint) in EngineCore's disk tier (tiny random
llama, CPU): `agent_system` at the first user-turn start once the prompt is prefilled, `agent_session`
of prompt + reply at the finish, served to a fresh engine over the same directory."""

from __future__ import annotations

import random
from pathlib import Path

from kvserve.config import KVStoreConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.request import CheckpointHint
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine

USER = [VOCAB - 2, VOCAB - 1]  # the "user turn starts" marker of this test's template
ASSISTANT = [VOCAB - 3]
HINT = CheckpointHint("s1", save_system=True, save_session=True)
REPLY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB - 3) for _ in range(n)]  # never a marker


def _engine(model: Path, directory: Path) -> EngineCore:
    # No start-up preload: these tests read the request-time disk hits.
    engine = make_engine(model, kv_store=KVStoreConfig(directory=str(directory), preload_fraction=0.0))
    assert engine.disk_tier is not None
    engine.disk_tier.turn_markers = (USER, ASSISTANT)
    return engine


def _run(
    engine: EngineCore,
    prompt: list[int],
    request_id: str,
    hint: CheckpointHint | None = HINT,
    params: SamplingParams = REPLY,
):
    request = engine.make_request(request_id, prompt, params, checkpoint_hint=hint)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request


def _checkpoints(engine: EngineCore) -> dict[str, list[int]]:
    """reason -> token counts, once the writer is done."""
    assert engine.disk_tier is not None
    engine.disk_tier.writer.flush()
    found: dict[str, list[int]] = {}
    for checkpoint in engine.disk_tier.store.checkpoints():
        found.setdefault(checkpoint.meta.reason, []).append(checkpoint.meta.num_tokens)
    return {reason: sorted(counts) for reason, counts in found.items()}


def test_system_and_session_checkpoints_serve_a_fresh_engine(tiny_llama_dir: Path, tmp_path: Path) -> None:
    system = _tokens(600, 1)
    prompt = system + USER + _tokens(300, 2) + ASSISTANT  # 904 tokens
    engine = _engine(tiny_llama_dir, tmp_path)
    reply, _ = _run(engine, prompt, "turn1")
    saved = _checkpoints(engine)
    assert saved["agent_system"] == [592]  # the first user-turn start (600), block aligned
    assert saved["agent_session"] == [(904 + 40 - 1) // 16 * 16]  # the last sampled token has no KV

    fresh = _engine(tiny_llama_dir, tmp_path)  # a restart: RAM is empty
    follow_up = prompt + reply + USER + _tokens(20, 3) + ASSISTANT
    _, request = _run(fresh, follow_up, "turn2")
    assert request.num_cached_tokens == 928  # all of the previous prompt and reply, from disk
    assert fresh.disk_tier is not None and fresh.disk_tier.stats().num_hits == 1

    other_session = system + USER + _tokens(300, 4) + ASSISTANT  # a new session, same system prompt
    _, request = _run(_engine(tiny_llama_dir, tmp_path), other_session, "new", params=SHORT)
    assert request.num_cached_tokens == 592


def test_without_a_hint_only_the_automatic_reasons_are_saved(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_llama_dir, tmp_path)
    _run(engine, _tokens(600, 5) + USER + _tokens(300, 6) + ASSISTANT, "plain", hint=None, params=SHORT)
    assert set(_checkpoints(engine)) == {"cold"}


def test_a_hint_without_a_disk_tier_is_ignored(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir)
    assert engine.disk_tier is None
    tokens, request = _run(engine, _tokens(40, 7) + USER + _tokens(10, 8), "no-disk", params=SHORT)
    assert len(tokens) == 2 and request.is_finished


def test_a_session_keeps_only_its_latest_checkpoint(tiny_llama_dir: Path, tmp_path: Path) -> None:
    prompt = _tokens(600, 9) + USER + _tokens(300, 10) + ASSISTANT
    engine = _engine(tiny_llama_dir, tmp_path)
    reply, _ = _run(engine, prompt, "turn1", params=SHORT)
    assert _checkpoints(engine)["agent_session"] == [(len(prompt) + 2 - 1) // 16 * 16]
    turn2 = prompt + reply + USER + _tokens(60, 11) + ASSISTANT
    reply2, _ = _run(engine, turn2, "turn2", params=SHORT)
    latest = (len(turn2) + 2 - 1) // 16 * 16
    assert _checkpoints(engine)["agent_session"] == [latest]  # turn 1's was superseded and deleted
    other = _tokens(600, 9) + USER + _tokens(300, 12) + ASSISTANT
    _run(engine, other, "other", hint=CheckpointHint("s2", save_session=True), params=SHORT)
    assert len(_checkpoints(engine)["agent_session"]) == 2  # another session's is its own
    same_name = _tokens(600, 14) + USER + _tokens(300, 15) + ASSISTANT  # s1 again, not extending turn 2
    _run(engine, same_name, "same-name", params=SHORT)
    assert _checkpoints(engine)["agent_session"] == [896, 896, latest]  # turn 2's stays: not contained

    fresh = _engine(tiny_llama_dir, tmp_path)
    _, request = _run(fresh, turn2 + reply2 + USER + _tokens(10, 13) + ASSISTANT, "turn3", params=SHORT)
    assert request.num_cached_tokens == latest  # the surviving checkpoint still serves the session
