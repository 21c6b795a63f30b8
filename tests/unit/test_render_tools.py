"""Hermes-style fallback for chat templates that cannot render tools (SmolLM2's ChatML)."""

from __future__ import annotations

import json

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart, ToolCallPart, ToolResultPart, ToolSpec
from kvserve.chat.render import CHATML_TEMPLATE, ChatRenderer, renders_tools
from kvserve.chat.tools import tools_from_openai
from kvserve.toolcalls import CallEnd, CallStart, TextChunk, get_parser

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS_TEMPLATE = (
    "{% if tools %}[{{ tools | length }} tools]{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
)

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
INSTRUCTION = (
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _user(text: str) -> Message:
    return Message("user", (TextPart(text),))


def _system(text: str) -> Message:
    return Message("system", (TextPart(text),))


def _schema_line(spec: ToolSpec) -> str:
    function = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
    return json.dumps({"type": "function", "function": function}, ensure_ascii=False)


def test_detects_templates_that_render_tools() -> None:
    assert renders_tools(TOOLS_TEMPLATE)
    assert renders_tools("{% if tools is defined %}x{% endif %}")
    assert not renders_tools(SMOLLM2)
    assert not renders_tools(CHATML_TEMPLATE)
    # `tool_calls` in messages or a loop-local named like it is not the `tools` variable
    assert not renders_tools("{% for m in messages %}{{ m.tool_calls }}{% endfor %}")
    assert not renders_tools("{% set tools = [] %}{{ tools }}")


def test_template_with_tools_support_still_gets_them() -> None:
    request = ChatRequest(messages=(_user("hi"),), tools=(WEATHER,))
    assert ChatRenderer(TOOLS_TEMPLATE).render(request) == "[1 tools]hi"


def test_smollm2_gets_a_hermes_system_block_with_tools() -> None:
    request = ChatRequest(messages=(_user("Weather in Paris?"),), tools=(WEATHER, ToolSpec("noop")))
    text = ChatRenderer(SMOLLM2).render(request)
    assert text == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{_schema_line(WEATHER)}\n{_schema_line(ToolSpec('noop'))}\n</tools>\n\n"
        f"{INSTRUCTION}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_block_is_merged_into_the_first_system_message() -> None:
    request = ChatRequest(messages=(_system("Be brief."), _user("x")), tools=(WEATHER,))
    text = ChatRenderer(SMOLLM2).render(request)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert text.count("<|im_start|>system") == 1
    assert f"{INSTRUCTION}<|im_end|>\n<|im_start|>user\nx<|im_end|>\n" in text


def test_missing_template_falls_back_to_chatml_with_tools() -> None:
    text = ChatRenderer(None).render(ChatRequest(messages=(_user("x"),), tools=(WEATHER,)))
    assert text.startswith("<|im_start|>system\n# Tools") and _schema_line(WEATHER) in text


def test_tool_choice_none_renders_no_tools() -> None:
    request = ChatRequest(messages=(_user("x"),), tools=(WEATHER,), tool_choice="none")
    assert ChatRenderer(SMOLLM2).render(request) == ChatRenderer(SMOLLM2).render(
        ChatRequest(messages=(_user("x"),))
    )


def _history() -> tuple[Message, ...]:
    return (
        _user("Weather in Paris and Rome?"),
        Message(
            "assistant",
            (
                TextPart("Checking."),
                ToolCallPart("c1", "get_weather", '{ "city":"Paris",  "days":2 }'),
                ToolCallPart("c2", "get_weather", '{"city": "Rome"}'),
            ),
        ),
        Message("tool", (ToolResultPart("c1", "sunny"),)),
        Message("tool", (ToolResultPart("c2", "rain <b>&</b>"),)),
        Message("assistant", (TextPart("Paris: sunny. Rome: rain."),)),
    )


def test_history_calls_and_results_render_hermes_style() -> None:
    text = ChatRenderer(SMOLLM2).render(ChatRequest(messages=_history(), tools=(WEATHER,)))
    assert (
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain <b>&</b>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nParis: sunny. Rome: rain.<|im_end|>\n"
    ) in text
    assert "<|im_start|>tool" not in text


def test_call_without_text_starts_the_assistant_turn() -> None:
    messages = (_user("x"), Message("assistant", (ToolCallPart("c1", "noop", ""),)))
    text = ChatRenderer(SMOLLM2).render(ChatRequest(messages=messages), add_generation_prompt=False)
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call><|im_end|>\n'
    )


def test_history_tool_calls_render_even_without_offered_tools() -> None:
    # tool_choice "none" on a follow-up turn: no <tools> block, but the calls made are not dropped
    request = ChatRequest(messages=_history(), tools=(WEATHER,), tool_choice="none")
    text = ChatRenderer(SMOLLM2).render(request)
    assert "<tools>" not in text and "# Tools" not in text
    assert '"arguments": {"city": "Paris", "days": 2}' in text and "<tool_response>\nsunny" in text


@pytest.mark.parametrize(
    "arguments",
    [
        '{"city": "Paris", "days": 2}',
        '{"q": "a \\"quoted\\" </tool_call> é 😀", "n": {"deep": [1, null]}}',
        "{}",
    ],
)
def test_rendered_history_call_round_trips_through_the_hermes_parser(arguments: str) -> None:
    call = ToolCallPart("c1", "get_weather", arguments)
    messages = (_user("x"), Message("assistant", (TextPart("ok"), call)))
    text = ChatRenderer(SMOLLM2).render(
        ChatRequest(messages=messages, tools=(WEATHER,)), add_generation_prompt=False
    )
    assistant = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parser = get_parser("hermes", (WEATHER,))
    events = parser.feed(assistant) + parser.finish()
    starts = [e for e in events if isinstance(e, CallStart)]
    ends = [e for e in events if isinstance(e, CallEnd)]
    assert [s.name for s in starts] == ["get_weather"]
    assert len(ends) == 1 and json.loads(ends[0].arguments) == json.loads(arguments)
    # the parser's raw markup is exactly the rendered bytes (what tool replay memory stores)
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) + ends[0].raw == assistant


def test_semantically_equal_requests_render_byte_identical_prompts() -> None:
    def request(tools_json: str, arguments: str) -> ChatRequest:
        messages = (
            _system("sys"),
            _user("x"),
            Message("assistant", (ToolCallPart("c1", "get_weather", arguments),)),
            Message("tool", (ToolResultPart("c1", "ok"),)),
        )
        return ChatRequest(messages=messages, tools=tools_from_openai(json.loads(tools_json)))

    compact = (
        '[{"type":"function","function":{"name":"get_weather","description":"W \\u00e9",'
        '"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
    )
    spaced = (
        '[ { "type": "function", "function": { "name": "get_weather", "description": "W é",\n'
        '  "parameters": { "type" : "object", "properties" : { "city" : { "type" : "string" } } } } } ]'
    )
    renderer = ChatRenderer(SMOLLM2)
    first = renderer.render(request(compact, '{"city":"Paris"}'))
    second = renderer.render(request(spaced, '{ "city" : "Paris" }'))
    assert first == second
    assert '"description": "W é"' in first


def test_requests_without_tools_are_unchanged() -> None:
    messages = (_system("s"), _user("a"), Message("assistant", (TextPart("b"),)), _user("c"))
    text = ChatRenderer(SMOLLM2).render(ChatRequest(messages=messages))
    assert text == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\na<|im_end|>\n"
        "<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    )
