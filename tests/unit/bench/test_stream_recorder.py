"""Stream completeness rules and per-protocol parsing of `StreamRecorder` (no network)."""

from __future__ import annotations

import json

import pytest

from kvserve.bench.client import STRICT, Api, StreamRecorder, StreamRules

CHAT_OK = [
    '{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',  # role preamble: not a token
    '{"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
    '{"choices":[{"index":0,"delta":{"content":"lo"}}]}',
    '{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    '{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}',
    "[DONE]",
]


def _feed(api: Api, payloads: list[str], rules: StreamRules = STRICT) -> StreamRecorder:
    recorder = StreamRecorder(api, 0.0, rules)
    for i, payload in enumerate(payloads):
        recorder.feed(payload, 1.0 + i)
    return recorder


def test_chat_stream_complete_with_cached_tokens() -> None:
    r = _feed(Api.CHAT, CHAT_OK).result(3)
    assert r.is_success, r.error
    assert r.generated_text == "Hello"
    assert r.ttft == 2.0  # the role-only chunk at t=1 does not count
    assert (r.prompt_len, r.output_len, r.cached_tokens) == (7, 2, 4)


@pytest.mark.parametrize(
    ("drop", "reason"),
    [
        (3, "finish reason"),
        (4, "usage"),
        (5, "[DONE]"),
    ],
)
def test_incomplete_chat_streams_are_failures(drop: int, reason: str) -> None:
    payloads = CHAT_OK[:drop] + CHAT_OK[drop + 1 :]
    r = _feed(Api.CHAT, payloads).result(3)
    assert not r.is_success
    assert reason in r.error
    assert r.prompt_len == 3 and r.output_len == 0


def test_error_event_fails_even_after_content() -> None:
    payloads = [*CHAT_OK[:3], '{"error":{"message":"engine died","type":"server_error"}}', *CHAT_OK[3:]]
    r = _feed(Api.CHAT, payloads).result(3)
    assert not r.is_success and "engine died" in r.error


def test_named_error_event_and_malformed_data_fail() -> None:
    recorder = StreamRecorder(Api.CHAT, 0.0)
    recorder.feed('{"message":"overloaded"}', 1.0, event="error")
    assert "error event" in recorder.result(1).error
    assert "malformed" in _feed(Api.CHAT, ["{not json", *CHAT_OK]).result(1).error


def test_no_content_is_a_failure() -> None:
    r = _feed(Api.CHAT, [CHAT_OK[0], *CHAT_OK[3:]]).result(1)
    assert not r.is_success and "no generated content" in r.error


def test_usage_waived_counts_content_chunks() -> None:
    payloads = [p for p in CHAT_OK if "usage" not in p]
    assert not _feed(Api.CHAT, payloads).result(9).is_success
    r = _feed(Api.CHAT, payloads, StreamRules(require_usage=False)).result(9)
    assert r.is_success and r.output_len == 2 and r.prompt_len == 9 and r.cached_tokens is None


def test_reasoning_and_tool_call_deltas_count_as_output() -> None:
    payloads = [
        '{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}',
        *CHAT_OK[3:],
    ]
    r = _feed(Api.CHAT, payloads).result(1)
    assert r.is_success and r.ttft == 1.0 and r.itl == (1.0,)


def test_anthropic_stream() -> None:
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 3, "cache_read_input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]
    payloads = [json.dumps(e) for e in events]
    r = _feed(Api.ANTHROPIC, payloads).result(1)
    assert r.is_success, r.error
    assert (r.prompt_len, r.cached_tokens, r.output_len, r.ttft) == (8, 5, 2, 3.0)
    cut = _feed(Api.ANTHROPIC, payloads[:-1]).result(1)
    assert not cut.is_success and "message_stop" in cut.error
    err = _feed(Api.ANTHROPIC, [*payloads[:3], '{"type":"error","error":{"type":"overloaded_error"}}'])
    assert "overloaded_error" in err.result(1).error


def test_without_usage_a_length_finish_means_max_tokens() -> None:
    # One chunk carried two tokens (a held-back multibyte character): chunks would undercount.
    payloads = [
        '{"choices":[{"index":0,"delta":{"content":"a"}}]}',
        '{"choices":[{"index":0,"delta":{"content":"\u00e9"}}]}',
        '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
        "[DONE]",
    ]
    rules = StreamRules(require_usage=False)
    assert _feed(Api.CHAT, payloads, rules).result(1, max_tokens=3).output_len == 3
    assert _feed(Api.CHAT, payloads, rules).result(1).output_len == 2
    stopped = [*payloads[:2], payloads[2].replace("length", "stop"), payloads[3]]
    assert _feed(Api.CHAT, stopped, rules).result(1, max_tokens=3).output_len == 2
