"""Against a real uvicorn server: disconnects abort the engine request, concurrent streams complete."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.api.conftest import MODEL, LiveServer, wait_until
from tests.api.fake_engine import FakeEngine, reply

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
ANTHROPIC = {
    "model": MODEL,
    "max_tokens": 1000,
    "messages": [{"role": "user", "content": "Hi"}],
    "stream": True,
}


async def _read_then_close(client: httpx.AsyncClient, path: str, body: dict) -> None:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            if b"content" in chunk or b"text_delta" in chunk:
                break  # mid-generation: close the connection


async def test_streaming_disconnects_abort_every_request(live_server: LiveServer) -> None:
    engine = live_server.engine
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
        await asyncio.gather(
            *(
                _read_then_close(
                    client, "/v1/chat/completions" if i % 2 else "/v1/messages", CHAT if i % 2 else ANTHROPIC
                )
                for i in range(20)
            )
        )
        started = time.monotonic()
        await wait_until(lambda: len(engine.aborted) == 20, timeout=2.0)
        assert time.monotonic() - started < 0.5
    assert not engine.running


async def test_non_streaming_disconnect_aborts(live_server: LiveServer) -> None:
    engine = live_server.engine
    async with httpx.AsyncClient(base_url=live_server.url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
    cancelled_at = time.monotonic()
    await wait_until(lambda: len(engine.aborted) == 1, timeout=2.0)
    assert time.monotonic() - cancelled_at < 0.2
    assert not engine.running


@pytest.mark.parametrize(
    "live_server", [FakeEngine(reply("concurrent reply " * 5), token_delay_s=0.001)], indirect=True
)
async def test_sixteen_concurrent_streams_complete(live_server: LiveServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{live_server.url}/v1", api_key="k", max_retries=0)

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one(i) for i in range(16)))
    assert texts == ["concurrent reply " * 5] * 16
    assert len(live_server.engine.requests) == 16 and not live_server.engine.aborted
    await client.close()


@pytest.mark.parametrize(
    "live_server", [FakeEngine(reply("late"), num_prefill_chunks=100, chunk_delay_s=0.05)], indirect=True
)
async def test_disconnect_during_prefill_aborts_at_once(live_server: LiveServer) -> None:
    """Nothing is streamed while a long prompt prefills, yet a client that leaves is noticed at once."""
    engine = live_server.engine
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", ANTHROPIC)):
            async with client.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                await wait_until(lambda: len(engine.running) == 1)
            closed_at = time.monotonic()
            await wait_until(lambda: not engine.running, timeout=2.0)
            assert time.monotonic() - closed_at < 0.2
    assert len(engine.aborted) == 2
