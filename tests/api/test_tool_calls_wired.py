"""The output-syntax composer wired into ChatService: a hermes tool call sampled by the (fake)
model reaches each API as that protocol's native tool call, streaming and not."""

from __future__ import annotations

import json

import pytest

from kvserve.serving.segmenter import OutputSyntax
from tests.api.conftest import make_harness
from tests.api.fake_engine import FakeEngine, reply

CALL = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture
async def tool_harness():
    syntax = OutputSyntax.detect(None, "hermes")
    h = make_harness(FakeEngine(reply(CALL)), segmenter_factory=syntax.segmenter)
    yield h
    await h.http.aclose()


async def test_openai_chat_returns_a_tool_call(tool_harness) -> None:
    response = await tool_harness.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=OPENAI_TOOLS
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 32
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_openai_chat_stream_has_the_same_call_id(tool_harness) -> None:
    stream = await tool_harness.openai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=OPENAI_TOOLS,
        stream=True,
    )
    ids, names, arguments, finish = set(), [], "", None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.id:
                    ids.add(delta.id)
                if delta.function and delta.function.name:
                    names.append(delta.function.name)
                if delta.function and delta.function.arguments:
                    arguments += delta.function.arguments
    assert len(ids) == 1 and names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris"} and finish == "tool_calls"


async def test_anthropic_messages_return_tool_use(tool_harness) -> None:
    message = await tool_harness.anthropic.messages.create(
        model="m",
        max_tokens=256,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=ANTHROPIC_TOOLS,
    )
    assert message.stop_reason == "tool_use"
    text, tool_use = message.content
    assert text.type == "text" and text.text == "Let me check."
    assert tool_use.type == "tool_use" and tool_use.id.startswith("toolu_")
    assert tool_use.name == "get_weather" and tool_use.input == {"city": "Paris"}


async def test_without_tools_the_markup_stays_text(tool_harness) -> None:
    response = await tool_harness.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}]
    )
    assert response.choices[0].message.content == CALL
    assert not response.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": ""}]}, "tools.0.name"),
        ("/v1/responses", {"input": "x", "tools": [{"type": "namespace", "tools": []}]}, "tools.0.name"),
        (
            "/v1/responses",
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": [1]}]},
            "tools.0.parameters",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": ""}}],
            },
            "tools.0.function.name",
        ),
    ],
)
async def test_bad_tool_schemas_are_openai_400s(tool_harness, path: str, body: dict, param: str) -> None:
    response = await tool_harness.http.post(path, json={"model": "m", **body})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_bad_tool_schemas_are_anthropic_400s(tool_harness) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": ""}],
    }
    response = await tool_harness.http.post("/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json()["type"] == "error" and "tools.0.name" in response.json()["error"]["message"]
