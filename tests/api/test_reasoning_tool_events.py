"""Every reasoning/tool event sequence in the three chat APIs, read through the official SDKs.

The FakeEngine samples `<think>…</think>`, text and a Hermes call (or reasoning cut by max_tokens);
the real output-syntax composer turns it into events and each API's encoder into its wire shape.
"""

from __future__ import annotations

import json

import pytest

from kvserve.reasoning import SYNTAXES as REASONING
from kvserve.serving.segmenter import OutputSyntax
from tests.api.conftest import Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

THOUGHT = "Paris needs a lookup."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OUTPUT = f"<think>{THOUGHT}</think>Let me check.\n{CALL}"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}]
CUT = "<think>never ends"  # cut by max_tokens inside the reasoning block
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _harness(output: str, eos: bool = True) -> Harness:
    syntax = OutputSyntax("hermes", REASONING["think"])
    return make_harness(FakeEngine(reply(output, eos=eos)), segmenter_factory=syntax.segmenter)


def _squash(kinds: list[str]) -> list[str]:
    """Runs of the same kind collapsed to one (deltas arrive per token)."""
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


# -- OpenAI Chat -------------------------------------------------------------------------------


async def test_openai_chat_stream_reasoning_text_then_call() -> None:
    h = _harness(OUTPUT)
    stream = await h.openai.chat.completions.create(model="m", messages=USER, tools=OPENAI_TOOLS, stream=True)
    kinds, reasoning, text, calls, finish = [], "", "", [], None
    async for chunk in stream:
        choice = chunk.choices[0]
        delta = choice.delta
        finish = choice.finish_reason or finish
        if getattr(delta, "reasoning_content", None):
            kinds.append("reasoning")
            reasoning += delta.reasoning_content
        if delta.content:
            kinds.append("content")
            text += delta.content
        for call in delta.tool_calls or []:
            kinds.append("call_start" if call.id else "call_args")
            if call.id:
                calls.append([call.id, call.function.name, ""])
            calls[call.index][2] += call.function.arguments or ""
    assert _squash(kinds) == ["reasoning", "content", "call_start", "call_args"]
    assert (reasoning, text, finish) == (THOUGHT, "Let me check.", "tool_calls")
    ((call_id, name, arguments),) = calls
    assert (
        call_id.startswith("call_") and name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    )


async def test_openai_chat_non_stream_and_unterminated_reasoning() -> None:
    h = _harness(OUTPUT)
    response = await h.openai.chat.completions.create(model="m", messages=USER, tools=OPENAI_TOOLS)
    message = response.choices[0].message
    assert message.reasoning_content == THOUGHT and message.content == "Let me check."
    assert message.tool_calls[0].function.name == "get_weather"
    cut = _harness(CUT, eos=False)
    response = await cut.openai.chat.completions.create(model="m", messages=USER, max_tokens=len(CUT))
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "length"
    assert message.reasoning_content == "never ends" and message.content == ""


# -- Anthropic ---------------------------------------------------------------------------------


async def test_anthropic_stream_thinking_signature_text_tool_use() -> None:
    h = _harness(OUTPUT)
    events = []
    stream = await h.anthropic.messages.create(
        model="m", max_tokens=300, messages=USER, tools=ANTHROPIC_TOOLS, stream=True
    )
    async for event in stream:
        if event.type == "content_block_start":
            events.append(f"start:{event.content_block.type}")
        elif event.type == "content_block_delta":
            events.append(event.delta.type)
        elif event.type == "message_delta":
            events.append(f"message_delta:{event.delta.stop_reason}")
        else:
            events.append(event.type)
    assert _squash(events) == [
        "message_start",
        "start:thinking",
        "thinking_delta",
        "signature_delta",
        "content_block_stop",
        "start:text",
        "text_delta",
        "content_block_stop",
        "start:tool_use",
        "input_json_delta",
        "content_block_stop",
        "message_delta:tool_use",
        "message_stop",
    ]
    async with h.anthropic.messages.stream(
        model="m", max_tokens=300, messages=USER, tools=ANTHROPIC_TOOLS
    ) as accumulated:
        final = await accumulated.get_final_message()
    thinking, text, tool_use = final.content
    assert thinking.thinking == THOUGHT and thinking.signature == final.id
    assert text.text == "Let me check." and tool_use.input == {"city": "Paris"}


async def test_anthropic_non_stream_and_unterminated_thinking() -> None:
    h = _harness(OUTPUT)
    message = await h.anthropic.messages.create(
        model="m", max_tokens=300, messages=USER, tools=ANTHROPIC_TOOLS
    )
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.stop_reason == "tool_use" and message.content[2].id.startswith("toolu_")
    cut = _harness(CUT, eos=False)
    message = await cut.anthropic.messages.create(model="m", max_tokens=len(CUT), messages=USER)
    assert message.stop_reason == "max_tokens"
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, text.type, text.text) == ("thinking", "never ends", "text", "")


@pytest.mark.parametrize(
    ("thinking", "output_config", "expected"),
    [
        ({"type": "disabled"}, None, (False, None)),
        ({"type": "enabled", "budget_tokens": 2048}, None, (True, "low")),
        ({"type": "enabled", "budget_tokens": 32000}, None, (True, "high")),
        ({"type": "adaptive"}, {"effort": "medium"}, (True, "medium")),
        (None, {"effort": "none"}, (False, "none")),
    ],
)
def test_anthropic_thinking_controls(thinking, output_config, expected) -> None:
    from kvserve.api.anthropic_messages.adapter import to_chat_request
    from kvserve.api.anthropic_messages.schema import MessagesRequest

    body = {"messages": USER, "max_tokens": 5, "thinking": thinking, "output_config": output_config}
    chat = to_chat_request(MessagesRequest.model_validate({k: v for k, v in body.items() if v is not None}))
    assert (chat.reasoning.enabled, chat.reasoning.effort) == expected


async def test_bad_thinking_controls_are_400s() -> None:
    h = _harness(OUTPUT)
    body = {"model": "m", "max_tokens": 5, "messages": USER, "thinking": {"type": "sometimes"}}
    response = await h.http.post("/v1/messages", json=body)
    assert response.status_code == 400 and response.json()["type"] == "error"
    body = {"model": "m", "messages": USER, "thinking": {"type": "maybe"}}
    response = await h.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "thinking.type"


def test_openai_chat_thinking_switches() -> None:
    from kvserve.api.openai_chat.adapter import to_chat_request
    from kvserve.api.openai_chat.schema import ChatCompletionRequest

    def control(**fields):
        chat = to_chat_request(ChatCompletionRequest.model_validate({"messages": USER, **fields}))
        return chat.reasoning.enabled, chat.reasoning.effort

    assert control(reasoning_effort="low") == (True, "low")
    assert control(reasoning_effort="none") == (False, "none")
    assert control(thinking=False) == (False, None)
    assert control(thinking={"type": "enabled"}, reasoning_effort="high") == (True, "high")
    assert control(chat_template_kwargs={"enable_thinking": False}) == (False, None)


# -- Responses ---------------------------------------------------------------------------------


async def test_responses_stream_reasoning_summary_message_function_call() -> None:
    h = _harness(OUTPUT)
    stream = await h.openai.responses.create(
        model="m",
        input="Weather in Paris?",
        tools=RESPONSES_TOOLS,
        reasoning={"summary": "auto"},
        stream=True,
    )
    events, final = [], None
    async for event in stream:
        events.append(event)
        if event.type == "response.completed":
            final = event.response
    assert _squash([e.type for e in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning, message, call = final.output
    assert reasoning.summary[0].text == THOUGHT and message.content[0].text == "Let me check."
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.id for i in added] == [i.id for i in done] == [o.id for o in final.output]
    assert added[2].status == "in_progress" and added[2].arguments == ""
    assert done[2].call_id == call.call_id and call.call_id.startswith("call_") and len(call.call_id) == 37
    (args_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.item_id == call.id and json.loads(args_done.arguments) == {"city": "Paris"}
    assert call.status == "completed" and final.status == "completed"


async def test_responses_without_summary_drop_reasoning_and_unterminated_is_incomplete() -> None:
    h = _harness(OUTPUT)
    response = await h.openai.responses.create(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS)
    assert [o.type for o in response.output] == ["message", "function_call"]
    cut = _harness(CUT, eos=False)
    response = await cut.openai.responses.create(
        model="m", input="Hi", reasoning={"summary": "detailed"}, max_output_tokens=len(CUT)
    )
    assert response.status == "incomplete" and response.output_text == ""
    (reasoning,) = response.output
    assert reasoning.type == "reasoning" and reasoning.status == "incomplete"
    assert reasoning.summary[0].text == "never ends"


# -- one table of outputs, six ways to read them ---------------------------------------------


# name -> (sampled text, ends with EOS, what a client sees: reasoning, text, (name, arguments) calls, finish)
SCENARIOS = {
    "text": ("Just text.", True, ("", "Just text.", (), "stop")),
    "reasoning": ("<think>r</think>Text", True, ("r", "Text", (), "stop")),
    "call_only": (CALL, True, ("", "", (("get_weather", {"city": "Paris"}),), "tool_calls")),
    "two_blocks": (
        CALL + "\n" + CALL.replace("Paris", "Lyon"),
        True,
        ("", "", (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})), "tool_calls"),
    ),
    "malformed": (
        "<tool_call>\n{not json}\n</tool_call>",
        True,
        ("", "<tool_call>\n{not json}\n</tool_call>", (), "stop"),
    ),
    "truncated": (
        '<think>go</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        False,
        ("go", "", (("get_weather", {"city": "Par"}),), "length"),
    ),
}


async def _openai_chat(h: Harness, stream: bool, max_tokens: int) -> tuple:
    kwargs = {"model": "m", "messages": USER, "tools": OPENAI_TOOLS, "max_tokens": max_tokens}
    if not stream:
        choice = (await h.openai.chat.completions.create(**kwargs)).choices[0]
        m = choice.message
        calls = tuple((c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or ())
        return (getattr(m, "reasoning_content", None) or "", m.content or "", calls, choice.finish_reason)
    reasoning, text, calls, finish = "", "", [], None
    async for chunk in await h.openai.chat.completions.create(**kwargs, stream=True):
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        reasoning += getattr(delta, "reasoning_content", None) or ""
        text += delta.content or ""
        for call in delta.tool_calls or []:
            if call.id:
                calls.append([call.function.name, ""])
            calls[call.index][1] += call.function.arguments or ""
    return (reasoning, text, tuple((n, json.loads(a)) for n, a in calls), finish)


async def _anthropic(h: Harness, stream: bool, max_tokens: int) -> tuple:
    kwargs = {"model": "m", "messages": USER, "tools": ANTHROPIC_TOOLS, "max_tokens": max_tokens}
    if stream:
        async with h.anthropic.messages.stream(**kwargs) as s:
            message = await s.get_final_message()
    else:
        message = await h.anthropic.messages.create(**kwargs)
    blocks = message.content
    finish = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}[message.stop_reason]
    return (
        "".join(b.thinking for b in blocks if b.type == "thinking"),
        "".join(b.text for b in blocks if b.type == "text"),
        tuple((b.name, b.input) for b in blocks if b.type == "tool_use"),
        finish,
    )


async def _responses(h: Harness, stream: bool, max_tokens: int) -> tuple:
    kwargs = {
        "model": "m",
        "input": "Weather in Paris?",
        "tools": RESPONSES_TOOLS,
        "max_output_tokens": max_tokens,
        "reasoning": {"summary": "auto"},
    }
    if stream:
        async for event in await h.openai.responses.create(**kwargs, stream=True):
            if event.type in ("response.completed", "response.incomplete"):
                response = event.response
    else:
        response = await h.openai.responses.create(**kwargs)
    out = response.output
    calls = tuple((o.name, json.loads(o.arguments)) for o in out if o.type == "function_call")
    finish = "length" if response.status == "incomplete" else "tool_calls" if calls else "stop"
    return (
        "".join(o.summary[0].text for o in out if o.type == "reasoning"),
        response.output_text,
        calls,
        finish,
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "read", [_openai_chat, _anthropic, _responses], ids=["chat", "anthropic", "responses"]
)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_every_api_reads_the_same_output(scenario: str, read, stream: bool) -> None:
    output, eos, expected = SCENARIOS[scenario]
    h = _harness(output, eos=eos)
    max_tokens = len(output.encode()) + (5 if eos else 0)
    assert await read(h, stream, max_tokens) == expected


async def test_responses_custom_tool_calls_are_custom_tool_call_items() -> None:
    """A free-text tool (Codex's apply_patch): the model's `{"input": TEXT}` reaches the client as TEXT."""
    patch = "*** Begin Patch\n*** Add File: a.py\n+print('<&>')\n*** End Patch"
    call = json.dumps({"name": "apply_patch", "arguments": {"input": patch}})
    h = _harness(f"<tool_call>\n{call}\n</tool_call>")
    tools = [{"type": "custom", "name": "apply_patch", "description": "Edit files"}]
    events = [
        e async for e in await h.openai.responses.create(model="m", input="Edit", tools=tools, stream=True)
    ]
    types = [e.type for e in events]
    assert types[2:7] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    (item,) = events[-1].response.output
    assert (item.type, item.name, item.input) == ("custom_tool_call", "apply_patch", patch)
    assert events[2].item.id == item.id and item.call_id.startswith("call_")
    again = await h.openai.responses.create(model="m", input="Edit", tools=tools)
    assert again.output[0].type == "custom_tool_call" and again.output[0].input == patch
