"""The soak's pure parts: request bodies per API, the stream reader on recorded events, the plans
and the verdict."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from kvserve.bench.server_probe import PoolSample, ProcessSample, ServerSample
from kvserve.bench.soak import SoakOptions, SoakRun
from kvserve.bench.soak_client import (
    CutPoint,
    Outcome,
    RequestRecord,
    SoakMix,
    classify_status,
    plan_conversation,
    plan_cut,
)
from kvserve.bench.soak_summary import summarize, ttft_drift, ttft_windows
from kvserve.bench.soak_wire import SoakApi, StreamReader, ToolCall, Turn, TurnRequest, request_body
from kvserve.serving.tool_continuation import ANTHROPIC, RESPONSES

CALL = ToolCall("call_1", "read_file", '{"path":"a.py"}')
HISTORY = [Turn(user_text="read a.py", tool_call=CALL, response_id="resp_1")]


def test_chat_follow_up_carries_the_call_and_its_result() -> None:
    body = request_body(SoakApi.CHAT, "sys", HISTORY, TurnRequest(tool_result="print(1)"), "m")
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert body["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"}
    assert body["stream"] and body["stream_options"] == {"include_usage": True}


def test_anthropic_follow_up_sends_tool_use_then_tool_result() -> None:
    body = request_body(SoakApi.ANTHROPIC, "sys", HISTORY, TurnRequest(tool_result="print(1)"), "m")
    assert body["system"] == "sys"
    assistant, result = body["messages"][1], body["messages"][2]
    assert assistant["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.py"}}
    ]
    assert result["content"][0] == {"type": "tool_result", "tool_use_id": "call_1", "content": "print(1)"}


def test_responses_chains_on_the_previous_id_with_only_the_new_input() -> None:
    body = request_body(SoakApi.RESPONSES, "sys", HISTORY, TurnRequest(tool_result="print(1)"), "m")
    assert body["previous_response_id"] == "resp_1"
    assert body["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "print(1)"}]
    first = request_body(SoakApi.RESPONSES, "sys", [], TurnRequest("hi", force_tool=True), "m")
    assert first["instructions"] == "sys" and first["tool_choice"] == "required" and first["store"]


def test_a_conflict_replays_the_responses_history_instead_of_chaining() -> None:
    body = request_body(
        SoakApi.RESPONSES, "sys", HISTORY, TurnRequest(tool_result="print(1)"), "m", chain=False
    )
    assert "previous_response_id" not in body and body["instructions"] == "sys"
    assert [item["type"] for item in body["input"]] == ["message", "function_call", "function_call_output"]
    assert body["input"][1]["call_id"] == body["input"][2]["call_id"] == "call_1"


def test_only_the_continuation_gone_409_is_an_expected_conflict() -> None:
    # The server's own errors, in each API's shape: the soak must recognise its wording.
    responses = json.dumps({"error": {"message": RESPONSES.gone().message, "type": "conflict_error"}})
    anthropic = json.dumps({"type": "error", "error": {"message": ANTHROPIC.gone().message}})
    assert RESPONSES.gone().status == ANTHROPIC.gone().status == 409
    assert classify_status(409, responses) is Outcome.CONFLICT
    assert classify_status(409, anthropic) is Outcome.CONFLICT
    unknown_id = json.dumps({"error": {"message": RESPONSES.unknown("call_x").message}})
    assert classify_status(400, unknown_id) is Outcome.HTTP_4XX  # an id never given: the client's bug
    assert classify_status(409, '{"error": {"message": "something else"}}') is Outcome.HTTP_4XX
    assert classify_status(409, None) is Outcome.HTTP_4XX
    assert classify_status(503, responses) is Outcome.HTTP_5XX


def _feed(api: SoakApi, events: list[tuple[str | None, dict | str]]) -> StreamReader:
    reader = StreamReader(api)
    for name, data in events:
        reader.feed(name, data if isinstance(data, str) else json.dumps(data))
    return reader


def test_reader_follows_a_chat_tool_call_stream() -> None:
    reader = _feed(
        SoakApi.CHAT,
        [
            (None, {"choices": [{"delta": {"role": "assistant"}}]}),
            (
                None,
                {
                    "choices": [
                        {
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "call_9",
                                        "function": {"name": "read_file", "arguments": ""},
                                    }
                                ]
                            }
                        }
                    ]
                },
            ),
            (
                None,
                {
                    "choices": [
                        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]}}
                    ]
                },
            ),
            (
                None,
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}}]},
            ),
            (None, {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            (None, "[DONE]"),
        ],
    )
    assert reader.is_done and reader.error is None and reader.num_content_events == 3
    assert reader.turn(TurnRequest("q")).tool_call == ToolCall("call_9", "read_file", '{"path":"x"}')


def test_reader_takes_the_responses_id_and_completion() -> None:
    reader = _feed(
        SoakApi.RESPONSES,
        [
            ("response.created", {"type": "response.created", "response": {"id": "resp_7"}}),
            ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hi"}),
            ("response.completed", {"type": "response.completed", "response": {"id": "resp_7"}}),
        ],
    )
    turn = reader.turn(TurnRequest("q"))
    assert reader.is_done and turn.response_id == "resp_7" and turn.answer == "hi"


def test_reader_reports_errors_and_missing_end() -> None:
    failed = _feed(SoakApi.ANTHROPIC, [("error", {"type": "error", "error": {"type": "api_error"}})])
    assert failed.error is not None
    cut = _feed(
        SoakApi.ANTHROPIC, [("content_block_delta", {"type": "content_block_delta", "delta": {"text": "a"}})]
    )
    assert cut.error is None and not cut.is_done


def test_plans_follow_the_mix() -> None:
    rng = random.Random(1)
    never = SoakMix(disconnect_share=0.0)
    assert all(plan_cut(rng, never) is None for _ in range(100))
    always = SoakMix(disconnect_share=1.0)
    points = {plan_cut(rng, always).point for _ in range(100)}  # type: ignore[union-attr]
    assert points == set(CutPoint)
    plans = [plan_conversation(rng, SoakApi.CHAT, SoakMix(tool_share=1.0)) for _ in range(20)]
    assert all(p.opens_with_tool and p.num_turns >= 2 for p in plans)


def _record(
    started_s: float, outcome: Outcome, ttft_s: float | None = 0.1, status: int | None = 200
) -> RequestRecord:
    return RequestRecord(0, SoakApi.CHAT, "first", started_s, 1.0, outcome, status, ttft_s=ttft_s)


def _sample(rss: int, fds: int, used: int) -> ServerSample:
    return ServerSample(0.0, ProcessSample(rss, fds, 10), PoolSample(100, used, 0, 10, 1 << 20), None)


def test_verdict_passes_a_clean_run_and_names_each_failure() -> None:
    records = [_record(t, Outcome.OK) for t in range(0, 60, 2)]
    clean = SoakRun(
        SoakOptions(duration_s=60), records, _sample(1 << 30, 20, 0), [], _sample(1 << 30, 21, 0), 0.5
    )
    summary = summarize(clean)
    assert summary.passed, summary.checks
    bad = SoakRun(
        SoakOptions(duration_s=60),
        [*records, _record(5, Outcome.HTTP_5XX, None, 500), _record(6, Outcome.HUNG, None)],
        _sample(1 << 30, 20, 0),
        [_sample(3 << 30, 20, 5)],
        _sample(1 << 30, 60, 3),
        60.0,
    )
    conflicted = replace(clean, records=[*records, _record(7, Outcome.CONFLICT, None, 409)])
    summary = summarize(conflicted)
    assert summary.passed and summary.outcomes["conflict"] == 1, summary.checks
    failed = {c.name for c in summarize(bad).checks if not c.passed}
    assert failed == {
        "no 5xx",
        "no hung request",
        "KV blocks back to idle",
        "no leaked descriptors",
        "RSS within idle + KV pool + overhead",
    }


def test_ttft_windows_and_drift() -> None:
    # The first third is warm-up (cold, all clients at once): drift is the last third over the middle.
    records = [_record(t, Outcome.OK, ttft_s=5.0 if t < 20 else 0.2 if t < 40 else 0.5) for t in range(60)]
    windows = ttft_windows(records, 60, 6)
    assert [w.num_requests for w in windows] == [10] * 6
    assert windows[0].p50_ms == 5000 and windows[-1].p99_ms == 500
    assert ttft_drift(windows) == 2.5
