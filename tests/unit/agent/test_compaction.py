"""The pure compaction rules: trigger, tail boundary, compacted conversation."""

from __future__ import annotations

from kvserve.agent.compaction import TokenEstimator, compacted, should_compact, tail_start
from kvserve.agent.messages import Message, ToolCall


def test_trigger_at_85_percent_or_low_free_room() -> None:
    assert not should_compact(84_000, 100_000) and should_compact(85_000, 100_000)
    assert should_compact(92_000, 100_000)  # only 8K free
    assert not should_compact(700, 4096) and should_compact(3073, 4096)  # reserve ctx/4 on small contexts


def _conversation() -> list[Message]:
    msgs = [Message("system", "s")]
    for i in range(10):
        msgs += [
            Message("user", f"task {i} " + "u" * 50),
            Message("assistant", "", tool_calls=(ToolCall(f"c{i}", "read", "{}"),)),
            Message("tool", "t" * 200, tool_call_id=f"c{i}"),
            Message("assistant", "a" * 50),
        ]
    return msgs


def test_the_tail_starts_at_a_user_turn_within_the_budget() -> None:
    msgs = _conversation()
    est = TokenEstimator(chars_per_token=1.0)
    start = tail_start(msgs, ctx=10 * 1000, estimator=est)  # budget 1000 tokens: 2 turns of ~340
    assert msgs[start].role == "user" and est.tokens(msgs[start:]) <= 1000
    assert est.tokens(msgs[start - 4 :]) > 1000  # the earliest boundary that fits


def test_past_the_budget_the_nearest_boundary_within_twice_it() -> None:
    msgs = _conversation()
    est = TokenEstimator(chars_per_token=1.0)
    start = tail_start(msgs, ctx=10 * 250, estimator=est)  # budget 250 < one turn (~340) < 500
    assert start == len(msgs) - 4
    assert tail_start(msgs, ctx=10 * 100, estimator=est) == len(msgs)  # nothing fits: no tail


def test_internal_messages_and_the_first_turn_are_never_the_boundary() -> None:
    msgs = [Message("system", "s"), Message("user", "only turn"), Message("assistant", "x")]
    assert tail_start(msgs, 100_000, TokenEstimator()) == len(msgs)
    msgs = [Message("system", "s"), Message("user", "a"), Message("user", "summary", is_internal=True)]
    assert tail_start(msgs, 100_000, TokenEstimator()) == len(msgs)


def test_compacted_conversation() -> None:
    system, tail = Message("system", "s"), [Message("user", "latest")]
    out = compacted(system, "  did things  ", tail, ["job 1 running for 3s (pid 9): make"])
    assert out[0] is system and out[2:] == tail
    assert out[1].role == "user" and out[1].is_internal
    assert "\ndid things\n" in out[1].content and out[1].content.endswith(
        "job 1 running for 3s (pid 9): make"
    )
