"""/v1/messages through the official anthropic SDK and raw SSE, over the FakeEngine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import pytest

from kvserve.api.anthropic_messages.adapter import MessagesStreamEncoder
from kvserve.api.errors import ApiError, anthropic_message
from kvserve.serving.events import (
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

USER = [{"role": "user", "content": "Hi"}]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


async def test_non_streaming_message(harness: Harness) -> None:
    message = await harness.anthropic.messages.create(model="claude-x", max_tokens=100, messages=USER)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "claude-x"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "Hello there!"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    n_prompt = len(harness.engine.requests[0][0])
    assert message.usage.input_tokens == n_prompt and message.usage.cache_read_input_tokens == 0
    assert message.usage.output_tokens == len(reply("Hello there!"))


async def test_second_turn_splits_cached_and_uncached_input(harness: Harness) -> None:
    first = await harness.anthropic.messages.create(model=MODEL, max_tokens=100, messages=USER)
    messages = USER + [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "More"},
    ]
    second = await harness.anthropic.messages.create(model=MODEL, max_tokens=100, messages=messages)
    usage = second.usage
    assert usage.cache_read_input_tokens > 0
    assert usage.input_tokens + usage.cache_read_input_tokens == len(harness.engine.requests[1][0])


async def test_stream_exact_event_sequence(harness: Harness) -> None:
    frames = await harness.sse(
        "/v1/messages?beta=true", {"model": MODEL, "max_tokens": 100, "messages": USER, "stream": True}
    )
    names = [name for name, _ in frames]
    n_text = names.count("content_block_delta")
    assert names == (
        ["message_start", "ping", "content_block_start"]
        + ["content_block_delta"] * n_text
        + ["content_block_stop", "message_delta", "message_stop"]
    )
    assert all(data["type"] == name for name, data in frames)
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert start["usage"]["input_tokens"] == len(harness.engine.requests[0][0])
    assert frames[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in frames if n == "content_block_delta")
    assert text == "Hello there!"
    assert frames[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert frames[-2][1]["usage"]["output_tokens"] == len(reply("Hello there!"))


async def test_sdk_stream_accumulates_the_final_message(harness: Harness) -> None:
    async with harness.anthropic.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hello there!" and final.content[0].text == "Hello there!"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


async def test_stop_sequence_is_reported() -> None:
    h = make_harness(FakeEngine(reply("one two three")))
    message = await h.anthropic.messages.create(
        model=MODEL, max_tokens=100, messages=USER, stop_sequences=["three"]
    )
    assert message.content[0].text == "one two "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "three")
    cut = await h.anthropic.messages.create(model=MODEL, max_tokens=3, messages=USER)
    assert (cut.content[0].text, cut.stop_reason) == ("one", "max_tokens")


async def test_system_blocks_drop_the_billing_header(harness: Harness) -> None:
    await harness.anthropic.messages.create(
        model=MODEL,
        max_tokens=10,
        messages=USER,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; hash=abc;"},
            {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Second part."},
        ],
    )
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    assert "billing" not in prompt
    assert "<|im_start|>system\nYou are helpful.\nSecond part.<|im_end|>" in prompt


async def test_tool_use_and_results_in_history(harness: Harness) -> None:
    messages = [
        {"role": "user", "content": "List files"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a.txt"}],
                },
                {"type": "text", "text": "what now?"},
            ],
        },
    ]
    tools = [
        {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    await harness.anthropic.messages.create(model=MODEL, max_tokens=10, messages=messages, tools=tools)
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    # SmolLM2's template knows no tools: Hermes-style fallback (kvserve/chat/hermes_tools.py)
    assert '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in prompt
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nwhat now?<|im_end|>"
    ) in prompt


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 10},
        {"max_tokens": 10, "messages": "hi"},
        {"max_tokens": "ten", "messages": USER},
        {"max_tokens": 10, "messages": [{"role": "robot", "content": "x"}]},
        {"max_tokens": 10, "messages": USER, "tool_choice": {"type": "maybe"}},
        {"max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}
            ],
        },
        {
            "max_tokens": 10,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                        }
                    ],
                }
            ],
        },
    ],
)
async def test_bad_requests_are_anthropic_400s(harness: Harness, body: dict) -> None:
    response = await harness.http.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["message"]


async def test_context_overflow_in_anthropic_shape() -> None:
    h = make_harness(FakeEngine(reply("x")), ctx=32)
    with pytest.raises(anthropic.BadRequestError) as info:
        await h.anthropic.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x" * 40}]
        )
    error = info.value.body["error"]
    assert error["n_ctx"] == 32 and error["n_prompt_tokens"] >= 40
    # Anthropic's wording, which Claude Code parses to compact and retry (its regex, 2.1.332).
    assert error["message"] == f"prompt is too long: {error['n_prompt_tokens']} tokens > 31 maximum"
    match = re.match(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", error["message"], re.IGNORECASE)
    assert match and int(match[1]) - int(match[2]) == error["n_prompt_tokens"] - 31


def test_a_prompt_of_exactly_the_context_is_one_token_over() -> None:
    """The longest prompt taken is the context less one (one token of output must fit): a prompt of
    exactly the context size reads one token over; other errors keep their own message."""
    overflow = ApiError(
        400,
        "Prompt has 32 tokens, but the configured context size is 32 tokens",
        code="context_length_exceeded",
        extra={"n_prompt_tokens": 32, "n_ctx": 32},
    )
    assert anthropic_message(overflow) == "prompt is too long: 32 tokens > 31 maximum"
    assert anthropic_message(ApiError(400, "max_tokens: must be >= 1")) == "max_tokens: must be >= 1"


async def test_count_tokens(harness: Harness) -> None:
    counted = await harness.anthropic.messages.count_tokens(model=MODEL, messages=USER)
    await harness.anthropic.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert counted.input_tokens == len(harness.engine.requests[0][0])


async def test_engine_failure_is_an_error_event() -> None:
    h = make_harness(FakeEngine(reply("abcdef"), fail_after=2))
    frames = await h.sse("/v1/messages", {"max_tokens": 10, "messages": USER, "stream": True})
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIError):
        async with h.anthropic.messages.stream(model=MODEL, max_tokens=10, messages=USER) as stream:
            async for _ in stream:
                pass


def test_encoder_block_sequence_for_thinking_text_and_tools() -> None:
    """The full block state machine (reasoning/tool events come from issue 4's parsers)."""
    encoder = MessagesStreamEncoder("msg_1", MODEL)
    events = [
        Usage(10, 0, 4),
        ReasoningDelta("think"),
        TextDelta("Hi"),
        ToolCallStart(0, "ab", "Bash"),
        ToolCallArgsDelta(0, '{"command":'),
        ToolCallArgsDelta(0, '"ls"}'),
        ToolCallEnd(0, '{"command":"ls"}'),
        ToolCallStart(1, "cd", "Read"),
        ToolCallEnd(1, '{"path":"x"}'),
        Usage(10, 7, 4),
        Finished("tool_calls"),
    ]
    frames = parse_sse("".join(f for e in events for f in encoder.encode(e)))
    summary = [
        (n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type")) for n, d in frames
    ]
    assert summary == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert frames[0][1]["message"]["usage"] == {
        "input_tokens": 6,
        "output_tokens": 0,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }
    assert frames[9][1]["content_block"]["id"] == "toolu_ab"
    assert frames[14][1]["delta"]["partial_json"] == '{"path":"x"}'
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_encoder_adds_an_empty_text_block_after_thinking_only() -> None:
    encoder = MessagesStreamEncoder("msg_1", MODEL)
    events = [Usage(3, 0, 0), ReasoningDelta("t"), Usage(3, 1, 0), Finished("length")]
    frames = parse_sse("".join(f for e in events for f in encoder.encode(e)))
    blocks = [d["content_block"]["type"] for n, d in frames if n == "content_block_start"]
    assert blocks == ["thinking", "text"] and frames[-2][1]["delta"]["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    "name", ["claude-code-2.1.197-bare_messages.json", "claude-code-2.1.332_messages.json"]
)
async def test_claude_code_first_requests_are_answered(name: str) -> None:
    h = make_harness(FakeEngine(reply("Hello from kvserve, friend.")), ctx=65536)
    body = json.loads((FIXTURES / name).read_text())
    for probe in ("/", "/api/hello"):  # 2.1.197's and 2.1.332's preconnects
        assert (await h.http.head(probe)).status_code == 200
    frames = await h.sse("/v1/messages?beta=true", body)
    assert frames[0][0] == "message_start" and frames[-1][0] == "message_stop"
    prompt = h.service.detokenize(h.engine.requests[0][0])
    assert "x-anthropic-billing-header" not in prompt and "Say hello in five words." in prompt
