"""logprobs / top_logprobs in Chat Completions and Completions (through the openai SDK); logit_bias
and seed checks."""

from __future__ import annotations

import openai
import pytest

from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

USER = [{"role": "user", "content": "Hi"}]
TEXT = "Hello there!"


def _expected(k: int) -> list[tuple[str, float, list[str]]]:
    """(token, logprob, top tokens) per character of TEXT, as the FakeEngine scripts them."""
    return [(c, -(i + 1) / 10, [chr(ord(c) + j) for j in range(k)]) for i, c in enumerate(TEXT)]


async def test_chat_logprobs_non_streaming(harness: Harness) -> None:
    completion = await harness.openai.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=2
    )
    assert harness.engine.requests[0][1].logprobs == 2
    content = completion.choices[0].logprobs.content
    # The end-of-turn token that finished the reply has no text and no entry.
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in content] == _expected(2)
    assert all(t.bytes == list(t.token.encode()) for t in content)
    assert content[0].top_logprobs[1].logprob == pytest.approx(-1.1)
    assert "".join(t.token for t in content) == completion.choices[0].message.content


async def test_chat_logprobs_streaming_match_the_text(harness: Harness) -> None:
    stream = await harness.openai.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=1, stream=True
    )
    text, tokens = "", []
    async for chunk in stream:
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            assert choice.delta.content, "logprobs ride on the chunk with their text"
            for t in choice.logprobs.content:
                tokens.append((t.token, t.logprob, [a.token for a in t.top_logprobs]))
    assert text == TEXT and tokens == _expected(1)


async def test_chat_logprobs_sampled_only_and_off(harness: Harness) -> None:
    only = await harness.openai.chat.completions.create(model=MODEL, messages=USER, logprobs=True)
    assert harness.engine.requests[-1][1].logprobs == 0
    assert [t.top_logprobs for t in only.choices[0].logprobs.content] == [[]] * len(TEXT)
    off = await harness.openai.chat.completions.create(model=MODEL, messages=USER)
    assert harness.engine.requests[-1][1].logprobs is None and off.choices[0].logprobs is None


async def test_stream_with_a_stop_string_flushes_logprobs_in_the_finish_chunk(harness: Harness) -> None:
    body = {"messages": USER, "stream": True, "logprobs": True, "stop": ["e!"]}
    frames = await harness.sse("/v1/chat/completions", body)
    chunks = [data for _, data in frames if data != "[DONE]"]
    logprobs = [c["choices"][0]["logprobs"] for c in chunks]
    tokens = [t["token"] for lp in logprobs if lp for t in lp["content"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello ther"
    # Every sampled token is reported once, the held-back "e!" in the finish chunk.
    assert "".join(tokens) == TEXT
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [t["token"] for t in chunks[-1]["choices"][0]["logprobs"]["content"]] == ["e", "!"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
    ],
)
async def test_chat_logprobs_bad_values_are_400(harness: Harness, body: dict, param: str) -> None:
    response = await harness.http.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert not harness.engine.requests


async def test_completions_logprobs_non_streaming(harness: Harness) -> None:
    completion = await harness.openai.completions.create(model=MODEL, prompt="p", logprobs=3, max_tokens=50)
    logprobs = completion.choices[0].logprobs
    expected = _expected(3)
    assert logprobs.tokens == [t for t, _, _ in expected]
    assert logprobs.token_logprobs == [v for _, v, _ in expected]
    assert [list(d) for d in logprobs.top_logprobs] == [top for _, _, top in expected]
    assert logprobs.text_offset == list(range(len(TEXT)))
    assert "".join(logprobs.tokens) == completion.choices[0].text == TEXT


async def test_completions_logprobs_streaming_offsets_continue(harness: Harness) -> None:
    stream = await harness.openai.completions.create(
        model=MODEL, prompt="p", logprobs=0, max_tokens=50, stream=True
    )
    tokens, offsets, text = [], [], ""
    async for chunk in stream:
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs is not None:
            tokens += choice.logprobs.tokens
            offsets += choice.logprobs.text_offset
    assert "".join(tokens) == text == TEXT
    assert offsets == list(range(len(TEXT)))


async def test_completions_logprobs_over_20_is_400(harness: Harness) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await harness.openai.completions.create(model=MODEL, prompt="p", logprobs=21)
    assert info.value.body["param"] == "logprobs"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    "bias,accepted",
    [
        ({"258": 5}, True),
        ({"0": -100, "104": 100.0}, True),
        ({"259": 1}, False),  # the ByteTokenizer's vocabulary is [0, 259)
        ({"-1": 1}, False),
        ({"99999999999999999999": 1}, False),
        ({"abc": 1}, False),
        ({" 1": 1}, False),
        ({"1": 100.5}, False),
        ({"1": "1"}, False),
    ],
)
async def test_logit_bias(path: str, bias: dict, accepted: bool) -> None:
    h = make_harness(FakeEngine(reply("ok")))
    body = {"messages": USER} if path == "/v1/chat/completions" else {"prompt": "p"}
    response = await h.http.post(path, json={**body, "logit_bias": bias})
    if accepted:
        assert response.status_code == 200, response.text
        assert h.engine.requests[0][1].logit_bias == tuple((int(k), float(v)) for k, v in bias.items())
    else:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"].startswith("logit_bias") and not h.engine.requests


async def test_logit_bias_through_the_sdk(harness: Harness) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await harness.openai.chat.completions.create(model=MODEL, messages=USER, logit_bias={"100000": 3})
    assert "outside the vocabulary" in info.value.message


@pytest.mark.parametrize("seed,status", [(2**63 - 1, 200), (-(2**63), 200), (2**63, 400), (-(2**70), 400)])
async def test_seed_must_fit_64_bits(harness: Harness, seed: int, status: int) -> None:
    response = await harness.http.post("/v1/chat/completions", json={"messages": USER, "seed": seed})
    assert response.status_code == status, response.text


async def test_responses_logprobs(harness: Harness) -> None:
    include = ["message.output_text.logprobs"]
    response = await harness.openai.responses.create(model=MODEL, input="Hi", include=include, top_logprobs=2)
    assert harness.engine.requests[0][1].logprobs == 2
    logprobs = response.output[0].content[0].logprobs
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in logprobs] == _expected(2)
    frames = await harness.sse("/v1/responses", {"input": "Hi", "stream": True, "include": include})
    deltas = [data for name, data in frames if name == "response.output_text.delta"]
    assert all([t["token"] for t in d["logprobs"]] == list(d["delta"]) for d in deltas)
    done = next(data for name, data in frames if name == "response.output_text.done")
    assert "".join(t["token"] for t in done["logprobs"]) == done["text"] == TEXT
    off = await harness.openai.responses.create(model=MODEL, input="Hi", top_logprobs=2)
    assert harness.engine.requests[-1][1].logprobs is None and off.output[0].content[0].logprobs == []
