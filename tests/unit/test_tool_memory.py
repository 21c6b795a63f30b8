"""Tool replay memory: bounds, LRU, block sharing, persistence, and byte-identical replay rendering."""

from __future__ import annotations

import json

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart, ToolCallPart, ToolResultPart
from kvserve.chat.render import ChatRenderer
from kvserve.chat.tools import tools_from_openai
from kvserve.serving.tool_memory import ToolReplayMemory, attach_replays, call_key

HEX_A, HEX_B, HEX_C = "a" * 32, "b" * 32, "c" * 32
SAMPLED = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
TOOLS = tools_from_openai(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
)


def test_client_prefixes_name_the_same_call() -> None:
    assert call_key(f"call_{HEX_A}") == call_key(f"toolu_{HEX_A}") == HEX_A
    assert call_key("call_custom-id") == "call_custom-id"  # not ours: kept whole


def test_replays_exactly_the_calls_of_remembered_blocks() -> None:
    memory = ToolReplayMemory()
    memory.remember([("<block1>", [HEX_A, HEX_B]), ("<block2>", [HEX_C])])
    assert memory.replay([f"call_{HEX_A}", f"call_{HEX_B}"]) == "<block1>"
    assert memory.replay([HEX_A, HEX_B, HEX_C]) == "<block1><block2>"
    assert memory.replay([HEX_A]) is None  # the block also holds B: replaying it would invent a call
    assert memory.replay([HEX_B, HEX_A]) == "<block1>"  # the client's call order: the sampled text
    assert memory.replay([HEX_A, HEX_B, "d" * 32]) is None
    assert memory.num_bytes == len("<block1>") + len("<block2>")  # a shared block counts once
    assert (memory.num_hits, memory.num_misses) == (3, 2)


def test_turns_that_sampled_the_same_text_both_replay() -> None:
    """An agent running the same call twice: one stored block, both turns replay it."""
    memory = ToolReplayMemory()
    memory.remember([("<ls>", [HEX_A])])
    memory.remember([("<ls>", [HEX_B])])
    assert memory.replay([HEX_A]) == memory.replay([HEX_B]) == "<ls>"
    assert memory.num_bytes == len("<ls>")
    assert memory.replay([HEX_A, HEX_B]) is None  # two calls, but each block holds one


def test_bounded_by_ids_oldest_out_and_lookups_refresh() -> None:
    memory = ToolReplayMemory(max_ids=2)
    memory.remember([("a", [HEX_A])])
    memory.remember([("b", [HEX_B])])
    assert memory.replay([HEX_A]) == "a"  # A is now the most recent
    memory.remember([("c", [HEX_C])])
    assert len(memory) == 2 and memory.knows(HEX_A) and not memory.knows(HEX_B)


def test_bounded_by_bytes_and_a_block_leaves_with_its_last_id() -> None:
    memory = ToolReplayMemory(max_bytes=10)
    memory.remember([("x" * 6, [HEX_A])])
    memory.remember([("y" * 6, [HEX_B])])
    assert not memory.knows(HEX_A) and memory.knows(HEX_B) and memory.num_bytes == 6
    memory.remember([("z" * 11, [HEX_C])])  # larger than the whole budget: never kept
    assert len(memory) == 0 and memory.num_bytes == 0


def test_json_round_trip_keeps_blocks_and_lru_order() -> None:
    memory = ToolReplayMemory()
    memory.remember([("<b1>", [HEX_A, HEX_B])])
    memory.remember([("<b2> ü", [HEX_C])])
    memory.replay([HEX_A, HEX_B])  # A, B newest
    data = json.loads(json.dumps(memory.to_json()))
    restored = ToolReplayMemory.from_json(data, max_ids=2)  # room for the two newest only
    assert restored.replay([HEX_A, HEX_B]) == "<b1>" and not restored.knows(HEX_C)
    assert ToolReplayMemory.from_json(memory.to_json()).replay([HEX_C]) == "<b2> ü"
    subset = memory.to_json([f"toolu_{HEX_C}"])  # what one checkpoint's prompt replays
    assert [b["text"] for b in subset["blocks"]] == ["<b2> ü"]
    fresh = ToolReplayMemory()
    fresh.merge_json(subset)
    assert fresh.replay([HEX_C]) == "<b2> ü" and len(fresh) == 1
    with pytest.raises(ValueError):
        ToolReplayMemory.from_json({"version": 99})
    with pytest.raises(ValueError):
        ToolReplayMemory.from_json({"version": 1, "blocks": [], "lru": [["x", 3]]})


def _history(arguments: str) -> ChatRequest:
    call = ToolCallPart(f"call_{HEX_A}", "get_weather", arguments)
    return ChatRequest(
        messages=(
            Message("user", (TextPart("Weather in Paris?"),)),
            Message("assistant", (TextPart("Let me check."), call)),
            Message("tool", (ToolResultPart(f"call_{HEX_A}", "18 C"),)),
        ),
        tools=TOOLS,
    )


@pytest.mark.parametrize("template", [None, "qwen"])
def test_reordered_arguments_render_the_sampled_bytes(template: str | None) -> None:
    """Hermes fallback (ChatML) and a template that renders tool calls itself: once the memory knows
    the call, any re-serialization of its arguments renders the same, sampled, bytes."""
    renderer = ChatRenderer(QWEN_LIKE if template else None)
    memory = ToolReplayMemory()
    memory.remember([(SAMPLED, [HEX_A])])
    spellings = [
        '{"city": "Paris", "unit": "C"}',
        '{"unit":"C","city":"Paris"}',
        '{ "unit" : "C", "city":"Paris" }',
    ]
    prompts = {renderer.render(attach_replays(_history(a), memory)) for a in spellings}
    assert len(prompts) == 1
    (prompt,) = prompts
    assert "Let me check." + SAMPLED in prompt
    # Without the memory (--disable-exact-tool-replay) the client's order shows through.
    canonical = renderer.render(_history(spellings[1]))
    assert "Let me check." + SAMPLED not in canonical and '"unit": "C", "city": "Paris"' in canonical


def test_tool_results_escape_only_their_own_closer() -> None:
    code = "if a < b && c > d: print('&amp;')\n</tool_response> done"
    request = ChatRequest(
        messages=(
            Message("user", (TextPart("run it"),)),
            Message("assistant", (ToolCallPart("c1", "get_weather", "{}"),)),
            Message("tool", (ToolResultPart("c1", code),)),
        ),
        tools=TOOLS,
    )
    for renderer in (ChatRenderer(None), ChatRenderer(QWEN_LIKE)):
        prompt = renderer.render(request)
        assert "if a < b && c > d: print('&amp;')\n&lt;/tool_response> done" in prompt


# A Qwen2.5-style template that renders tools, calls and results itself.
QWEN_LIKE = (
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}"
    '\n<tool_call>\n{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if tools %}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_two_equal_blocks_in_one_output_never_lose_a_call() -> None:
    """Blocks are stored by text, so one output with the same block twice cannot be told from one
    block: that turn renders canonically rather than with one call missing."""
    memory = ToolReplayMemory()
    memory.remember([("<ls>", [HEX_A]), ("<ls>", [HEX_B])])
    assert memory.replay([HEX_A, HEX_B]) is None


def test_the_composer_reports_each_block_with_its_calls() -> None:
    from kvserve.serving.segmenter import OutputSyntax

    segmenter = OutputSyntax("hermes", None).segmenter(_history("{}"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    for piece in ("text\n", call, "\n\n", call):
        segmenter.feed(piece)
    segmenter.finish()
    (first, ids1), (second, ids2) = segmenter.sampled_blocks
    assert (first, second) == ("\n" + call, "\n\n" + call) and len(ids1) == len(ids2) == 1
    assert segmenter.sampled_calls == {ids1[0]: first, ids2[0]: second}
