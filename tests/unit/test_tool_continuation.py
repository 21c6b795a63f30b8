"""The pure parts of live tool continuation: where the tool results start, which sequence they
continue (or which error they get), the template's tail, and the live-sequence bounds."""

from __future__ import annotations

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart, ToolCallPart, ToolResultPart
from kvserve.chat.render import ChatRenderer
from kvserve.serving.errors import RequestError
from kvserve.serving.live_sequences import LiveSequence, LiveSequences, request_fingerprint
from kvserve.serving.tool_continuation import (
    ANTHROPIC,
    RESPONSES,
    find_live_sequence,
    find_replayed_sequence,
    rendered_tail,
    reuse_live_prefix,
    split_tool_tail,
)
from kvserve.serving.tool_memory import ToolReplayMemory

HEX = "e" * 32
SYSTEM = Message("system", (TextPart("Be brief."),))
USER = Message("user", (TextPart("Weather?"),))
CALLING = Message("assistant", (TextPart("Checking."), ToolCallPart(f"call_{HEX}", "weather", "{}")))
RESULT = Message("tool", (ToolResultPart(f"call_{HEX}", "18 C"),))
REMINDER = Message("user", (TextPart("(reminder)"),))


def _sequence(messages: tuple[Message, ...], call_id: str = HEX, tokens: int = 3) -> LiveSequence:
    request = ChatRequest(messages=messages)
    return LiveSequence(
        (call_id,), tuple(range(tokens)), "prompt+out<E>", "<E>", request_fingerprint(request, messages)
    )


def test_split_tool_tail_shapes() -> None:
    full = split_tool_tail((SYSTEM, USER, CALLING, RESULT, REMINDER))
    assert full.calling_turn is CALLING and full.before_call == (SYSTEM, USER)
    assert full.tail == (RESULT, REMINDER) and full.result_ids == (f"call_{HEX}",)
    output_only = split_tool_tail((SYSTEM, RESULT))
    assert (
        output_only.calling_turn is None and output_only.head == (SYSTEM,) and output_only.tail == (RESULT,)
    )
    assert split_tool_tail((SYSTEM, USER)) is None
    assert split_tool_tail((USER, CALLING)) is None


def test_find_live_sequence_rules() -> None:
    live = LiveSequences()
    live.save(_sequence((SYSTEM, USER)))
    full = ChatRequest(messages=(SYSTEM, USER, CALLING, RESULT))
    assert find_live_sequence(full, ANTHROPIC, live, None)[1].call_ids == (HEX,)
    edited = ChatRequest(messages=(SYSTEM, Message("user", (TextPart("Other?"),)), CALLING, RESULT))
    assert find_live_sequence(edited, ANTHROPIC, live, None) is None  # rendered instead
    assert find_live_sequence(ChatRequest(messages=(SYSTEM, RESULT)), RESPONSES, live, None) is not None
    stranger = ChatRequest(messages=(Message("tool", (ToolResultPart("call_zzz", "x"),)),))
    with pytest.raises(RequestError) as caught:
        find_live_sequence(stranger, RESPONSES, live, None)
    assert caught.value.status == 400 and "call_id call_zzz" in caught.value.message
    memory = ToolReplayMemory()
    memory.remember([("<call>", [HEX])])
    with pytest.raises(RequestError) as caught:
        find_live_sequence(ChatRequest(messages=(RESULT,)), ANTHROPIC, LiveSequences(), memory)
    assert caught.value.status == 409


def test_find_replayed_sequence_needs_the_calling_turn_and_what_came_before() -> None:
    live = LiveSequences()
    live.save(_sequence((SYSTEM, USER)))
    answer = Message("assistant", (TextPart("18 C, sunny."),))
    for messages in ((SYSTEM, USER, CALLING, RESULT), (SYSTEM, USER, CALLING, RESULT, answer, REMINDER)):
        found = find_replayed_sequence(ChatRequest(messages=messages), live)
        assert found is not None and found[0].calling_turn is CALLING and found[0].tail == messages[3:]
    forced = ChatRequest(messages=(SYSTEM, USER, CALLING, RESULT), tool_choice="required")
    assert find_replayed_sequence(forced, live) is not None  # tool_choice does not render
    edited = (SYSTEM, Message("user", (TextPart("Other?"),)), CALLING, RESULT)
    assert find_replayed_sequence(ChatRequest(messages=edited), live) is None
    assert find_replayed_sequence(ChatRequest(messages=(SYSTEM, RESULT)), live) is None  # output only
    assert find_replayed_sequence(ChatRequest(messages=(SYSTEM, USER, CALLING, RESULT)), None) is None


def test_rendered_tail_is_what_the_template_writes_after_the_calling_turn() -> None:
    request = ChatRequest(messages=(USER, CALLING, RESULT))
    tail = rendered_tail(request, split_tool_tail(request.messages), ChatRenderer(None).render)
    assert (
        tail
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_reuse_live_prefix_needs_the_text_to_match() -> None:
    live = LiveSequences()
    live.save(_sequence((USER,)))
    messages = (USER, CALLING, RESULT)
    tokenize = lambda text: [ord(c) for c in text]
    assert reuse_live_prefix("prompt+out<E>rest", messages, live, tokenize).token_ids == [
        0,
        1,
        2,
        *map(ord, "rest"),
    ]
    # The template ends the turn differently: the sampled EOS is left out, the template's bytes kept.
    assert reuse_live_prefix("prompt+out</E>", messages, live, tokenize).token_ids == [
        0,
        1,
        *map(ord, "</E>"),
    ]
    assert reuse_live_prefix("other", messages, live, tokenize) is None


def test_live_sequences_are_bounded_by_count_and_tokens() -> None:
    live = LiveSequences(max_sequences=2, max_tokens=10)
    for i, n in enumerate((4, 4, 4)):
        live.save(_sequence((USER,), call_id=f"id{i}", tokens=n))
    assert len(live) == 2 and not live.knows("id0") and live.knows("id2")
    live.save(_sequence((USER,), call_id="big", tokens=9))
    assert len(live) == 1 and live.lookup(frozenset({"big"})) is not None
