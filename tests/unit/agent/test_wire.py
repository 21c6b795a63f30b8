"""Request bodies for both wire protocols, the SSE decoders, and the reply accumulator (tool-call
arguments split at every point reassemble to the same call)."""

from __future__ import annotations

import json

from kvserve.agent.events import (
    Finished,
    ModelRequest,
    ReasoningDelta,
    ReplyBuilder,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from kvserve.agent.messages import Message, ToolCall, Usage
from kvserve.agent.sse_decode import AnthropicDecoder, OpenAIChatDecoder
from kvserve.agent.wire import anthropic_body, openai_body

CALL = ToolCall("call_1", "read", '{"path": "a.txt"}')
MESSAGES = (
    Message("system", "sys"),
    Message("user", "hi"),
    Message("assistant", "Looking.", "hmm", (CALL, ToolCall("call_2", "list", "{}"))),
    Message("tool", "a.txt: lines 1-1", tool_call_id="call_1", name="read"),
    Message("tool", "2 entries", tool_call_id="call_2", name="list"),
    Message("user", "thanks"),
)
TOOLS = (("read", "Read a file", {"type": "object", "properties": {}}),)


def test_openai_body() -> None:
    body = openai_body(ModelRequest(MESSAGES, TOOLS, 100, 0.2, "none", extension={"session_id": "s"}), "m")
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["reasoning_effort"] == "none" and body["kvserve"] == {"session_id": "s"}
    assert body["tools"][0] == {
        "type": "function",
        "function": {"name": "read", "description": "Read a file", "parameters": TOOLS[0][2]},
    }
    assistant = body["messages"][2]
    assert assistant["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a.txt"}'},
    }
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "a.txt: lines 1-1"}
    assert "kvserve" not in openai_body(ModelRequest(MESSAGES, (), 10), "m")


def test_anthropic_body_merges_tool_results_into_one_user_turn() -> None:
    body = anthropic_body(ModelRequest(MESSAGES, TOOLS, 100, reasoning_effort="low", tool_choice="none"), "m")
    assert body["system"] == "sys" and body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["tool_choice"] == {"type": "none"}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "read",
        "input": {"path": "a.txt"},
    }
    results = body["messages"][2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[1] == {"type": "tool_result", "tool_use_id": "call_2", "content": "2 entries"}


def test_openai_decoder() -> None:
    decoder = OpenAIChatDecoder()
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": "r", "content": "c", "tool_calls": [
        {"index": 0, "id": "call_9", "function": {"name": "read", "arguments": ""}}]}, "finish_reason": None}]}  # fmt: skip
    assert decoder.decode(json.dumps(chunk)) == [
        ReasoningDelta("r"),
        TextDelta("c"),
        ToolCallDelta(0, "call_9", "read", ""),
    ]
    usage = {
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}},
    }
    assert decoder.decode(json.dumps(usage)) == [UsageReport(Usage(10, 2, 8))]
    assert decoder.decode("[DONE]") == []


def test_anthropic_decoder_counts_cached_input() -> None:
    decoder = AnthropicDecoder()
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 4, "cache_read_input_tokens": 96, "output_tokens": 0}},
    }
    assert decoder.decode(json.dumps(start)) == []
    block = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}},
    }
    assert decoder.decode(json.dumps(block)) == [ToolCallDelta(0, "toolu_1", "read")]
    delta = {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"a"'},
    }
    assert decoder.decode(json.dumps(delta)) == [ToolCallDelta(0, arguments='{"a"')]
    end = {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}
    assert decoder.decode(json.dumps(end)) == [UsageReport(Usage(100, 7, 96)), Finished("tool_calls")]


def test_tool_call_arguments_split_anywhere_reassemble() -> None:
    arguments = '{"path": "dir/ü.txt", "max_lines": 5}'
    for cut in range(len(arguments) + 1):
        reply = ReplyBuilder()
        for event in (TextDelta("a"), ToolCallDelta(0, "c1", "read"), ToolCallDelta(0, arguments=arguments[:cut]),
                      ToolCallDelta(0, arguments=arguments[cut:]), TextDelta("b"), Finished("tool_calls")):  # fmt: skip
            reply.add(event)
        assert reply.message() == Message("assistant", "ab", "", (ToolCall("c1", "read", arguments),))
        assert reply.finish_reason == "tool_calls"


def test_sse_comments_are_keepalives_or_kvserve_prefill_counts() -> None:
    from kvserve.agent.events import PrefillProgress, Waiting
    from kvserve.agent.sse_decode import decode_comment

    counts = decode_comment(' prefill_progress {"total":900,"cache":100,"processed":612,"time_ms":1500}')
    assert counts == PrefillProgress(900, 100, 612, 1.5)
    assert counts.fraction == 612 / 900 and counts.tokens_per_s == 512 / 1.5
    assert decode_comment(" keepalive") == Waiting()
    assert decode_comment(" prefill_progress {broken") == Waiting()  # another server's comment
    assert decode_comment(' prefill_progress {"total":1}') == Waiting()


def test_an_image_tool_result_in_both_apis() -> None:
    uri = "data:image/png;base64,iVBORw0KGgo="
    shown = (
        Message("tool", "a.png: image/png, 2x1 pixels", tool_call_id="call_1", name="view_image", image=uri),
    )
    text = {"type": "text", "text": "a.png: image/png, 2x1 pixels"}
    assert openai_body(ModelRequest(shown, (), 10), "m")["messages"][0]["content"] == [
        text,
        {"type": "image_url", "image_url": {"url": uri}},
    ]
    result = anthropic_body(ModelRequest(shown, (), 10), "m")["messages"][0]["content"][0]
    assert result["tool_use_id"] == "call_1" and result["content"] == [
        text,
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    ]
