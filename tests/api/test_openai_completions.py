"""/v1/completions: raw prompt, no chat template."""

from __future__ import annotations

import pytest

from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply


async def test_non_streaming_completion(harness: Harness) -> None:
    completion = await harness.openai.completions.create(model=MODEL, prompt="Once upon", max_tokens=50)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text == "Hello there!" and completion.choices[0].finish_reason == "stop"
    assert harness.service.detokenize(harness.engine.requests[0][0]) == "Once upon"  # no template
    assert completion.usage.prompt_tokens == len("Once upon")


async def test_default_max_tokens_is_openais_16() -> None:
    h = make_harness(FakeEngine(reply("x" * 40)))
    completion = await h.openai.completions.create(model=MODEL, prompt="p")
    assert completion.usage.completion_tokens == 16 and completion.choices[0].finish_reason == "length"


async def test_stream_sequence(harness: Harness) -> None:
    frames = await harness.sse(
        "/v1/completions",
        {"prompt": ["Once"], "stream": True, "max_tokens": 50, "stream_options": {"include_usage": True}},
    )
    chunks = [d for _, d in frames[:-1]]
    assert frames[-1][1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in chunks[:-2]) == "Hello there!"
    assert chunks[-2]["choices"][0]["text"] == "" and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 4
    assert all(c["object"] == "text_completion" for c in chunks)


async def test_stop_and_context_errors() -> None:
    h = make_harness(FakeEngine(reply("alpha beta")), ctx=16)
    completion = await h.openai.completions.create(model=MODEL, prompt="p", stop=" beta", max_tokens=10)
    assert completion.choices[0].text == "alpha"
    response = await h.http.post("/v1/completions", json={"prompt": "x" * 20})
    error = response.json()["error"]
    assert (
        response.status_code == 400
        and error["param"] == "prompt"
        and error["code"] == "context_length_exceeded"
    )


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "n": 3}, "n"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ""}, "prompt"),
    ],
)
async def test_bad_requests(harness: Harness, body: dict, param: str) -> None:
    response = await harness.http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
