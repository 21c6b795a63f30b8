"""The `kvserve` request extension: validated strictly (a 400 in each protocol's shape), handed to the
engine as a CheckpointHint, and `prefill_progress` turns keepalives into counts in SSE comments that
the official SDKs skip."""

from __future__ import annotations

import json
import re

import pytest

from kvserve.engine.request import CheckpointHint
from tests.api.conftest import MODEL, make_harness
from tests.api.fake_engine import FakeEngine, reply

USER = [{"role": "user", "content": "hi"}]
AGENT = {"session_id": "s1", "checkpoint": "agent_session", "system_checkpoint": "agent_system"}
PROGRESS = re.compile(r"^: prefill_progress (\{.*\})$", re.MULTILINE)


async def test_the_agent_hints_reach_the_engine_from_chat_and_messages() -> None:
    h = make_harness(FakeEngine(reply("ok")))
    await h.http.post("/v1/chat/completions", json={"messages": USER, "kvserve": AGENT})
    await h.http.post(
        "/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": USER, "kvserve": AGENT}
    )
    await h.http.post("/v1/chat/completions", json={"messages": USER})  # no extension: no hint
    only_system = {"system_checkpoint": "agent_system"}
    await h.http.post("/v1/chat/completions", json={"messages": USER, "kvserve": only_system})
    hint = CheckpointHint("s1", save_system=True, save_session=True)
    assert h.engine.checkpoint_hints == [hint, hint, None, CheckpointHint(None, save_system=True)]


@pytest.mark.parametrize(
    ("extension", "param"),
    [
        ({"checkpoint": "agent_sessions"}, "kvserve.checkpoint"),  # an unknown reason
        ({"prefill_progress": "yes"}, "kvserve.prefill_progress"),  # strict: not a bool
        ({"session_id": 7}, "kvserve.session_id"),
        ({"session_id": ""}, "kvserve.session_id"),
        ({"session": "s1"}, "kvserve.session"),  # unknown key: a typo is not silently dropped
        ("agent_session", "kvserve"),
    ],
)
async def test_a_bad_extension_is_a_protocol_400(extension: object, param: str) -> None:
    h = make_harness(FakeEngine(reply("ok")))
    response = await h.http.post("/v1/chat/completions", json={"messages": USER, "kvserve": extension})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    anthropic_body = {"model": MODEL, "max_tokens": 8, "messages": USER, "kvserve": extension}
    response = await h.http.post("/v1/messages", json=anthropic_body)
    assert response.status_code == 400
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert h.engine.requests == []


async def test_prefill_progress_comments_carry_rising_counts() -> None:
    engine = FakeEngine(reply("ok"), num_prefill_chunks=8, chunk_delay_s=0.1)
    h = make_harness(engine)
    body = {"messages": USER, "stream": True, "kvserve": {"prefill_progress": True}}
    response = await h.http.post("/v1/chat/completions", json=body)
    reports = [json.loads(m) for m in PROGRESS.findall(response.text)]
    num_prompt = len(engine.requests[0][0])
    # A chunk every 100 ms, at most one report per 250 ms: some, never one per chunk.
    assert 2 <= len(reports) <= 5, reports
    assert all(r["total"] == num_prompt and r["cache"] == 0 for r in reports)
    processed = [r["processed"] for r in reports]
    assert processed == sorted(processed) and 0 < processed[-1] < num_prompt
    assert reports[-1]["time_ms"] >= 300
    assert ": keepalive" not in response.text
    assert response.text.endswith("data: [DONE]\n\n")


async def test_without_the_flag_there_are_no_progress_comments() -> None:
    h = make_harness(FakeEngine(reply("ok"), num_prefill_chunks=8, chunk_delay_s=0.05), keepalive_s=0.1)
    response = await h.http.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    assert not PROGRESS.search(response.text) and ": keepalive\n\n" in response.text


async def test_the_official_sdks_read_a_stream_with_progress_comments() -> None:
    h = make_harness(FakeEngine(reply("Hello!"), num_prefill_chunks=6, chunk_delay_s=0.1))
    extra = {"kvserve": {"prefill_progress": True, **AGENT}}
    stream = await h.openai.chat.completions.create(model=MODEL, messages=USER, stream=True, extra_body=extra)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "Hello!"
    async with h.anthropic.messages.stream(
        model=MODEL, max_tokens=16, messages=USER, extra_body=extra
    ) as events:
        message = await events.get_final_message()
    assert message.content[0].text == "Hello!"
    raw = await h.http.post(
        "/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER, "stream": True, **extra}
    )
    assert PROGRESS.search(raw.text)  # the comments were there, and the SDK skipped them


async def test_responses_and_completions_take_the_extension_too() -> None:
    h = make_harness(FakeEngine(reply("ok")))
    bad = {"checkpoint": "agent_session", "extra": 1}
    for path, body in (("/v1/responses", {"input": "hi"}), ("/v1/completions", {"prompt": "hi"})):
        response = await h.http.post(path, json={**body, "kvserve": bad})
        assert response.status_code == 400 and response.json()["error"]["param"] == "kvserve.extra"
        response = await h.http.post(path, json={**body, "kvserve": {"checkpoint": "agent_session"}})
        assert response.status_code == 200, response.text
    assert h.engine.checkpoint_hints == [CheckpointHint(None, save_session=True)] * 2
