"""The agent's explicit checkpoints in the disk tier's policy: `agent_system` / `agent_session` are
anchors, an earlier `agent_session` of a conversation the incoming store extends goes first, and
the system cut is the first user-turn start."""

from __future__ import annotations

from pathlib import Path

from kvstore_helpers import Clock, open_store, random_tokens, save, text_of

from kvserve.kvstore.checkpoint import TextKey
from kvserve.kvstore.eviction import EvictionEntry, EvictionPolicy, eviction_score
from kvserve.kvstore.save_policy import system_cut

HOUR = 3600.0
POLICY = EvictionPolicy()


def _entry(reason: str, is_superseded: bool = False) -> EvictionEntry:
    return EvictionEntry("a", reason, 1000, 0, 0.0, 0.0, 0, frozenset({"a"}), is_superseded=is_superseded)  # type: ignore[arg-type]


def test_agent_checkpoints_are_anchors() -> None:
    plain = eviction_score(_entry("continued"), 1000, HOUR, POLICY)
    for reason in ("agent_system", "agent_session"):
        assert eviction_score(_entry(reason), 1000, HOUR, POLICY) == 2 * plain


def test_a_superseded_agent_session_loses_its_anchor_and_more() -> None:
    superseded = eviction_score(_entry("agent_session", is_superseded=True), 1000, HOUR, POLICY)
    assert superseded == 2 * 0.05 * eviction_score(_entry("continued"), 1000, HOUR, POLICY)
    # the system prompt is shared by every session: never "superseded" by one of them
    system = _entry("agent_system", is_superseded=True)
    assert eviction_score(system, 1000, HOUR, POLICY) == eviction_score(
        _entry("agent_system"), 1000, HOUR, POLICY
    )


def test_an_earlier_state_of_a_session_goes_before_an_unrelated_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    session, other = random_tokens(100, 1), random_tokens(64, 2)
    scratch = open_store(tmp_path / "scratch")
    for tokens in (session, other):
        save(scratch, tokens)
    store = open_store(tmp_path / "kv", budget_bytes=scratch.stats().total_bytes + 100, clock=clock)
    save(store, other, reason="continued")  # older, not an anchor: without supersession it would go
    clock.now += HOUR
    save(store, session[:50], reason="agent_session")  # the previous step of the same conversation
    clock.now += HOUR
    result = save(store, session, reason="agent_session")
    assert result.status == "stored"
    assert result.evicted_ids == (TextKey.of(text_of(session[:50])).sha1,)


def test_the_system_cut_is_the_first_user_turn_start() -> None:
    user = [7, 8]
    prompt = [1, 2, 3, 7, 8, 4, 5, 9, 7, 8, 6]
    assert system_cut(prompt, user) == 3
    assert system_cut([1, 2, 7, 4], user) is None  # a lone 7 is not the marker
    assert system_cut(prompt, ()) is None  # the template has no user marker
