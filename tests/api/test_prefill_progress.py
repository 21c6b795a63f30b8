"""Prefill progress: the engine's token-less chunk reports become keepalive events with real counts
on a fixed cadence, INFO log lines, and never a first token (usage, TTFT)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.engine_protocol import EngineOutput
from kvserve.serving.events import Finished, PrefillProgress, TextDelta, Usage
from kvserve.serving.heartbeat import with_heartbeat
from kvserve.serving.prefill_progress import PrefillTracker
from tests.api.conftest import make_harness
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply

CHAT = ChatRequest(messages=(Message("user", (TextPart("x" * 200),)),))


async def _events(engine: FakeEngine, keepalive_s: float) -> list[object]:
    service = ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=4096, keepalive_s=keepalive_s),
    )
    return [e async for e in service.generate(service.prepare_chat(CHAT))]


async def test_progress_outputs_are_not_the_first_token() -> None:
    engine = FakeEngine(reply("hi"), num_prefill_chunks=4)
    events = await _events(engine, keepalive_s=5.0)
    n_prompt = len(engine.requests[0][0])
    # Four progress outputs, no keepalive due yet: the stream is exactly that of a one-chunk prefill.
    assert events[0] == Usage(n_prompt, 0, 0)
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("h"), TextDelta("i")]
    assert events[-2:] == [Usage(n_prompt, len(reply("hi")), 0), Finished("stop")]
    assert not any(isinstance(e, PrefillProgress) for e in events)


async def test_keepalives_keep_their_cadence_and_carry_real_counts() -> None:
    # A chunk every 40 ms for 0.6 s, keepalives every 0.1 s: one beat per interval, neither one
    # per chunk (spam) nor none at all (a timer that each chunk resets would never fire).
    engine = FakeEngine(reply("ok"), num_prefill_chunks=15, chunk_delay_s=0.04)
    events = await _events(engine, keepalive_s=0.1)
    beats = [e for e in events if isinstance(e, PrefillProgress)]
    assert 3 <= len(beats) <= 7, len(beats)
    n_prompt = len(engine.requests[0][0])
    assert all(b.num_prompt_tokens == n_prompt for b in beats)
    computed = [b.num_computed_tokens for b in beats]
    assert computed == sorted(computed) and 0 < computed[-1] < n_prompt
    assert beats[-1].tokens_per_s > 0
    first_usage = next(i for i, e in enumerate(events) if isinstance(e, Usage))
    assert all(isinstance(e, PrefillProgress) for e in events[:first_usage])


async def test_heartbeat_is_not_reset_by_items() -> None:
    async def chatty() -> AsyncIterator[int]:
        for i in range(12):
            await asyncio.sleep(0.03)
            yield i

    items = [x async for x in with_heartbeat(chatty(), 0.1)]
    assert [x for x in items if x is not None] == list(range(12))
    assert 2 <= items.count(None) <= 4, items


async def test_heartbeat_stops_once_until_holds() -> None:
    """After the prefill the tokens pass straight through: no beats, every item in order."""

    async def slow() -> AsyncIterator[int]:
        for i in range(6):
            await asyncio.sleep(0.03)
            yield i

    seen: list[int] = []
    items = []
    async for x in with_heartbeat(slow(), 0.02, until=lambda: 2 in seen):
        items.append(x)
        if x is not None:
            seen.append(x)
    assert seen == list(range(6))
    assert None in items[: items.index(2)] and None not in items[items.index(2) :]


def test_prefill_log_lines_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    tracker = PrefillTracker("req-1", 1000, clock=lambda: now[0])

    def chunk(at: float, computed: int) -> None:
        now[0] = at
        tracker.update(EngineOutput("req-1", (), num_cached_tokens=200, num_computed_tokens=computed))

    with caplog.at_level(logging.INFO, logger="kvserve.serving.prefill_progress"):
        chunk(0.5, 300)
        chunk(2.1, 500)
        chunk(3.0, 600)
        chunk(4.2, 800)
        assert tracker.progress().num_computed_tokens == 800
        now[0] = 5.0
        tracker.finish(num_cached_tokens=200)
    assert [r.getMessage() for r in caplog.records] == [
        "request req-1 prefill: 500/1000 tokens (200 cached), 143 tok/s",
        "request req-1 prefill: 800/1000 tokens (200 cached), 143 tok/s",
        "request req-1 prefill done: 1000 tokens (200 cached) in 5.00 s, 160 tok/s",
    ]


async def test_ttft_is_measured_to_the_first_token_not_the_first_progress() -> None:
    engine = FakeEngine(reply("ok"), num_prefill_chunks=5, chunk_delay_s=0.04)
    h = make_harness(engine)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    response = await h.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
    metrics = (await h.http.get("/metrics")).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("kvserve_")
    }
    assert values["kvserve_time_to_first_token_seconds_count"] == 1
    assert values["kvserve_time_to_first_token_seconds_sum"] >= 0.2  # after all five chunks
    assert values["kvserve_generation_tokens_total"] == len(reply("ok"))
