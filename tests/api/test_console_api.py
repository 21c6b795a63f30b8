"""The web console's JSON API (/kvserve/v1/...) and its static page, over a FakeEngine."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from kvserve.serving.cache_view import BlockPoolView, CacheView, CheckpointView, DiskTierView
from tests.api.conftest import Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

SYSTEM = "You are a careful assistant. " * 8


def chat(question: str, max_tokens: int = 8) -> dict:
    return {
        "model": "fake-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
    }


def checkpoint(checkpoint_id: str, reason: str, num_tokens: int, hits: int, created: float, score: float):
    return CheckpointView(checkpoint_id, reason, num_tokens, num_tokens * 10, num_tokens * 5, hits, hits / 2,
                          created, created + 1, score)  # fmt: skip


def cache_view() -> CacheView:
    pool = BlockPoolView(16, 100, 10, 30, 90)
    checkpoints = [
        checkpoint("aaa", "cold", 512, 3, 1000.0, 2.0),
        checkpoint("bbb", "continued", 2048, 0, 3000.0, 0.5),
        checkpoint("ccc", "evict", 256, 9, 2000.0, 7.0),
    ]
    return CacheView(pool, DiskTierView("/tmp/kv", 10_000_000, 40_000, checkpoints))


@pytest.fixture
async def console() -> Harness:
    h = make_harness(FakeEngine(reply("Hello there!")))
    yield h
    await h.http.aclose()


async def test_recent_requests_show_source_and_divergence(console: Harness) -> None:
    assert (
        await console.http.post("/v1/chat/completions", json=chat("What is the date today?"))
    ).status_code == 200
    assert (
        await console.http.post("/v1/chat/completions", json=chat("What is the time now?"))
    ).status_code == 200
    body = (await console.http.get("/kvserve/v1/requests")).json()
    assert body["in_flight"] == [] and body["last_seq"] == 2
    first, second = body["recent"]
    assert (first["seq"], first["source"], first["num_cached_tokens"], first["divergence"]) == (
        1,
        "cold",
        0,
        None,
    )
    assert second["source"] == "ram" and second["num_cached_tokens"] > 0
    divergence = second["divergence"]
    assert divergence["reference_kind"] == "request" and divergence["reference_id"] == first["request_id"]
    assert divergence["after"].startswith("time now") and divergence["reference_after"].startswith(
        "date today"
    )
    assert divergence["before"].endswith("What is the ")
    assert (second["num_output_tokens"], second["outcome"]) == (8, "length")
    assert second["ttft_s"] is not None and second["duration_s"] >= second["ttft_s"]
    # The cursor: only what finished after it; and one request by id.
    assert (await console.http.get("/kvserve/v1/requests?after=1")).json()["recent"][0]["seq"] == 2
    one = (await console.http.get(f"/kvserve/v1/requests/{second['request_id']}")).json()
    assert one["divergence"] == divergence


async def test_in_flight_requests_show_prefill_progress() -> None:
    engine = FakeEngine(reply("x" * 50), num_prefill_chunks=4, chunk_delay_s=0.05, token_delay_s=0.01)
    h = make_harness(engine)
    task = asyncio.create_task(h.http.post("/v1/chat/completions", json=chat("hi", max_tokens=40)))
    seen = set()
    for _ in range(200):
        live = (await h.http.get("/kvserve/v1/requests")).json()["in_flight"]
        for r in live:
            seen.add(r["phase"])
            assert 0 <= r["num_computed_tokens"] <= r["num_prompt_tokens"]
        if task.done():
            break
        await asyncio.sleep(0.01)
    assert (await task).status_code == 200
    assert {"prefill", "decode"} <= seen
    assert (await h.http.get("/kvserve/v1/requests")).json()["in_flight"] == []
    await h.http.aclose()


async def test_aborted_stream_is_recorded(console: Harness) -> None:
    from kvserve.chat.conversation import ChatRequest, Message, TextPart

    service = console.service
    request = ChatRequest(messages=(Message("user", (TextPart("hi"),)),))
    events = service.generate(service.prepare_chat(request))
    await anext(events)
    await events.aclose()  # the client went away after the first event
    (record,) = service.recorder.recent()
    assert record.outcome == "aborted" and record.num_output_tokens < len("Hello there!")
    assert service.recorder.live() == []


@pytest.mark.parametrize(
    "query",
    ["after=-1", "after=x", "limit=0", "limit=1001", "limit=1.5"],
)
async def test_bad_request_queries_are_400(console: Harness, query: str) -> None:
    response = await console.http.get(f"/kvserve/v1/requests?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] in ("query.after", "query.limit")


async def test_unknown_request_is_404(console: Harness) -> None:
    response = await console.http.get("/kvserve/v1/requests/nope")
    assert response.status_code == 404 and "nope" in response.json()["error"]["message"]


async def test_cache_without_sources(console: Harness) -> None:
    body = (await console.http.get("/kvserve/v1/cache")).json()
    assert body["pool"] is None and body["disk"] is None and body["hit_rate"] == []
    response = await console.http.get("/kvserve/v1/cache/checkpoints")
    assert response.status_code == 404 and "no disk KV cache" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        ("", ["bbb", "aaa", "ccc"]),  # by score, lowest (next evicted) first
        ("sort=score&order=desc", ["ccc", "aaa", "bbb"]),
        ("sort=size&order=desc", ["bbb", "aaa", "ccc"]),
        ("sort=hits&order=desc&limit=1", ["ccc"]),
        ("sort=age&order=desc", ["aaa", "ccc", "bbb"]),  # oldest first
        ("sort=reason&offset=1", ["continued", "evict"]),
    ],
)
async def test_checkpoints_sorted(query: str, ids: list[str]) -> None:
    h = make_harness(FakeEngine(reply("ok")))
    h.http._transport.app.state.console = _with_cache_view(h)  # type: ignore[attr-defined]
    body = (await h.http.get(f"/kvserve/v1/cache/checkpoints?{query}")).json()
    key = "reason" if query.startswith("sort=reason") else "checkpoint_id"
    assert [c[key] for c in body["checkpoints"]] == ids
    assert body["total"] == 3
    assert body["checkpoints"][0]["age_s"] > 0
    await h.http.aclose()


@pytest.mark.parametrize("query", ["sort=bogus", "order=up", "limit=0", "limit=10001", "offset=-1"])
async def test_bad_checkpoint_queries_are_400(query: str) -> None:
    h = make_harness(FakeEngine(reply("ok")))
    h.http._transport.app.state.console = _with_cache_view(h)  # type: ignore[attr-defined]
    response = await h.http.get(f"/kvserve/v1/cache/checkpoints?{query}")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("query.")
    await h.http.aclose()


async def test_cache_summary_with_sources() -> None:
    h = make_harness(FakeEngine(reply("ok")))
    h.http._transport.app.state.console = _with_cache_view(h)  # type: ignore[attr-defined]
    await h.http.post("/v1/chat/completions", json=chat("hi"))
    body = (await h.http.get("/kvserve/v1/cache")).json()
    assert body["pool"]["num_used_blocks"] == 10 and body["disk"]["num_checkpoints"] == 3
    assert len(body["hit_rate"]) == 1 and body["hit_rate"][0]["num_requests"] == 1
    await h.http.aclose()


async def test_page_is_open_and_data_needs_the_key() -> None:
    h = make_harness(FakeEngine(reply("ok")), api_key="sesame")
    page = await h.http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/console/app.js" in page.text
    for asset in ("app.js", "api.js", "chat.js", "cache.js", "style.css"):
        assert (await h.http.get(f"/console/{asset}")).status_code == 200, asset
    assert (await h.http.get("/console/nope.js")).status_code == 404
    assert (await h.http.get("/kvserve/v1/requests")).status_code == 401
    assert (await h.http.get("/kvserve/v1/cache")).status_code == 401
    assert (await h.http.post("/console/app.js")).status_code == 401  # only reads are open
    ok = await h.http.get("/kvserve/v1/requests", headers={"Authorization": "Bearer sesame"})
    assert ok.status_code == 200
    await h.http.aclose()


async def test_console_api_is_in_the_openapi_page(console: Harness) -> None:
    paths = (await console.http.get("/openapi.json")).json()["paths"]
    for path in ("/kvserve/v1/requests", "/kvserve/v1/requests/{request_id}", "/kvserve/v1/cache",
                 "/kvserve/v1/cache/checkpoints"):  # fmt: skip
        assert "200" in paths[path]["get"]["responses"]
    assert "get" not in paths.get("/", {})  # the page is no API


def _with_cache_view(h: Harness):
    from dataclasses import replace

    state = h.http._transport.app.state.console  # type: ignore[attr-defined]
    return replace(state, cache_view=cache_view)


async def test_console_polls_are_logged_at_debug_unless_they_fail(
    console: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="kvserve.access"):
        await console.http.get("/kvserve/v1/requests")
        await console.http.get("/kvserve/v1/requests?limit=0")
        await console.http.get("/v1/models")
    levels = {
        " ".join(re.search(r"path=(\S+) status=(\d+)", r.getMessage()).groups()): r.levelno  # type: ignore[union-attr]
        for r in caplog.records
        if r.name == "kvserve.access"
    }
    assert levels == {
        "/kvserve/v1/requests 200": logging.DEBUG,
        "/kvserve/v1/requests 400": logging.INFO,
        "/v1/models 200": logging.INFO,
    }
