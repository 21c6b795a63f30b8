"""/v1/responses through the official openai SDK and raw SSE, over the FakeEngine."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from kvserve.api.openai_responses.encoder import ResponsesEncoder
from kvserve.chat.tools import tools_from_responses
from kvserve.serving.events import (
    Failed,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from tests.api.conftest import MODEL, Harness, make_harness, parse_sse
from tests.api.fake_engine import FakeEngine, reply

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


async def test_non_streaming_response(harness: Harness) -> None:
    response = await harness.openai.responses.create(model=MODEL, input="Hi", instructions="Be nice.")
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.output_text == "Hello there!"
    item = response.output[0]
    assert item.type == "message" and item.id.startswith("msg_") and item.status == "completed"
    assert response.usage.input_tokens == len(harness.engine.requests[0][0])
    assert response.usage.output_tokens == len(reply("Hello there!"))
    assert response.usage.input_tokens_details.cached_tokens == 0
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    assert prompt.startswith("<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHi<|im_end|>")


async def test_second_turn_reports_cached_tokens(harness: Harness) -> None:
    first = await harness.openai.responses.create(model=MODEL, input="Hi")
    second = await harness.openai.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Hi"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": first.output_text}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "More"}]},
        ],
    )
    assert second.usage.input_tokens_details.cached_tokens > 0


async def test_stream_exact_event_sequence(harness: Harness) -> None:
    frames = await harness.sse("/v1/responses", {"model": MODEL, "input": "Hi", "stream": True})
    types = [data["type"] for _, data in frames]
    n = types.count("response.output_text.delta")
    assert types == (
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        + ["response.output_text.delta"] * n
        + [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    )
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert all(name == data["type"] for name, data in frames)
    assert frames[0][1]["response"]["status"] == "in_progress" and frames[0][1]["response"]["output"] == []
    assert frames[2][1]["item"]["content"] == [] and frames[2][1]["item"]["status"] == "in_progress"
    done = frames[-1][1]["response"]
    assert done["output"][0]["content"][0]["text"] == "Hello there!" and done["usage"]["output_tokens"] > 0


async def test_sdk_stream(harness: Harness) -> None:
    stream = await harness.openai.responses.create(model=MODEL, input="Hi", stream=True)
    text, final = "", None
    async for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    assert text == "Hello there!" and final is not None and final.output_text == "Hello there!"


async def test_a_slow_prefill_sends_in_progress_events_not_comments() -> None:
    # Codex's idle timeout counts events only: a keepalive comment would not keep it waiting.
    h = make_harness(FakeEngine(reply("ok"), prefill_delay_s=0.3), keepalive_s=0.05)
    response = await h.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "stream": True})
    assert ": keepalive" not in response.text
    frames = parse_sse(response.text)
    types = [data["type"] for _, data in frames]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    beats = types.index("response.output_item.added") - 2
    assert beats >= 3 and types[2 : 2 + beats] == ["response.in_progress"] * beats, types
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert all(data["response"]["status"] == "in_progress" for _, data in frames[1 : 2 + beats])
    # The SDK reads the same stream to its end.
    stream = await h.openai.responses.create(model=MODEL, input="Hi", stream=True)
    kinds = [event.type async for event in stream]
    assert kinds.count("response.in_progress") >= 4 and kinds[-1] == "response.completed"


async def test_length_is_incomplete() -> None:
    h = make_harness(FakeEngine(reply("abcdef")))
    response = await h.openai.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "abc"


def test_encoder_reasoning_tools_and_namespaces() -> None:
    tools = tools_from_responses(
        [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "tool"}]}]
    )
    encoder = ResponsesEncoder("resp_1", MODEL, {}, include_reasoning=True, tools=tools)
    events = [
        Usage(5, 0, 0),
        ReasoningDelta("hmm"),
        TextDelta("ok"),
        ToolCallStart(0, "ab", "ns__tool"),
        ToolCallArgsDelta(0, "{}"),
        ToolCallEnd(0, "{}"),
        ToolCallStart(1, "cd", "plain"),
        ToolCallEnd(1, '{"a":1}'),
        Usage(5, 9, 0),
        Finished("tool_calls"),
    ]
    frames = parse_sse("".join(encoder.start() + [f for e in events for f in encoder.encode(e)]))
    types = [d["type"] for _, d in frames]
    assert types == [
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
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    output = frames[-1][1]["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "message", "function_call", "function_call"]
    assert (output[2]["namespace"], output[2]["name"], output[2]["call_id"]) == ("ns", "tool", "call_ab")
    assert (
        output[3]["name"] == "plain" and output[3]["arguments"] == '{"a":1}' and "namespace" not in output[3]
    )
    assert [d["output_index"] for _, d in frames if d["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_encoder_drops_reasoning_without_summary_opt_in_and_reports_failure() -> None:
    encoder = ResponsesEncoder("resp_1", MODEL, {}, include_reasoning=False)
    assert encoder.encode(ReasoningDelta("x")) == []
    frames = parse_sse("".join(encoder.encode(Failed("boom"))))
    assert frames[-1][1]["type"] == "response.failed"
    assert frames[-1][1]["response"]["error"] == {"code": "server_error", "message": "boom"}


async def test_input_items_render(harness: Harness) -> None:
    await harness.openai.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"type": "message", "role": "user", "content": "run it"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]},
            {"type": "function_call", "call_id": "call_9", "name": "exec", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "call_9", "output": "a.txt"},
            {"type": "compaction", "id": "c1"},
        ],
        tools=[
            {"type": "function", "name": "exec", "parameters": {"type": "object", "properties": {}}},
            {"type": "web_search"},
        ],
    )
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    # the tools block is merged into the developer message (Hermes-style fallback for SmolLM2)
    assert (
        "<|im_start|>system\ndev\n\n# Tools\n\n" in prompt and '{"name": "exec", "description": ""' in prompt
    )
    assert "web_search" not in prompt
    assert "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>" in prompt


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "mystery"}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0",
        ),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ],
)
async def test_bad_requests_are_openai_400s(harness: Harness, body: dict, param: str) -> None:
    response = await harness.http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_context_overflow_uses_param_input() -> None:
    h = make_harness(FakeEngine(reply("x")), ctx=32)
    with pytest.raises(openai.BadRequestError) as info:
        await h.openai.responses.create(model=MODEL, input="x" * 40)
    assert info.value.code == "context_length_exceeded" and info.value.param == "input"


async def test_codex_first_request_is_answered() -> None:
    h = make_harness(FakeEngine(reply("Hello from kvserve, friend.")), ctx=65536)
    body = json.loads((FIXTURES / "codex-0.171.0_responses.json").read_text())
    frames = await h.sse("/v1/responses", body)
    assert frames[0][1]["type"] == "response.created" and frames[-1][1]["type"] == "response.completed"
    assert frames[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello from kvserve, friend."
    prompt = h.service.detokenize(h.engine.requests[0][0])
    assert "Say hello in five words." in prompt


async def test_server_max_tokens_limit_ends_an_unbounded_response_as_incomplete() -> None:
    # Codex sends no max_output_tokens: --max-tokens-limit is the only bound on its answers.
    from kvserve.models.generation_config import resolve_sampling_defaults

    chat_settings = {
        "max_tokens_limit": 3,
        "sampling_defaults": resolve_sampling_defaults("none", overrides={"temperature": 0.0}),
    }
    h = make_harness(FakeEngine(reply("Hello there!")), chat_settings=chat_settings)
    response = await h.openai.responses.create(model=MODEL, input="Hi")
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.temperature == 0.0  # the server default it ran with, not the API's 1.0
    await h.http.aclose()
