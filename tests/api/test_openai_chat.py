"""/v1/chat/completions through the official openai SDK and raw SSE, over the FakeEngine."""

from __future__ import annotations

import pytest

from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

USER = [{"role": "user", "content": "Hi"}]


async def test_non_streaming_response_and_usage(harness: Harness) -> None:
    completion = await harness.openai.chat.completions.create(model="my-model", messages=USER)
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "my-model"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello there!"
    assert choice.finish_reason == "stop"
    usage = completion.usage
    n_prompt = len(harness.engine.requests[0][0])
    assert (usage.prompt_tokens, usage.completion_tokens) == (n_prompt, len(reply("Hello there!")))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_second_turn_reports_cached_tokens(harness: Harness) -> None:
    first = await harness.openai.chat.completions.create(model=MODEL, messages=USER)
    messages = USER + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And again?"},
    ]
    second = await harness.openai.chat.completions.create(model=MODEL, messages=messages)
    assert second.usage.prompt_tokens_details.cached_tokens > 0


async def test_stream_exact_sequence(harness: Harness) -> None:
    frames = await harness.sse(
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert all(name is None for name, _ in frames)
    chunks = [data for _, data in frames[:-1]]
    assert frames[-1][1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text_chunks = chunks[1:-2]
    assert "".join(c["choices"][0]["delta"]["content"] for c in text_chunks) == "Hello there!"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks)
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
        reply("Hello there!")
    )
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)


async def test_stream_without_include_usage_has_no_usage_chunk(harness: Harness) -> None:
    frames = await harness.sse("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True})
    assert all("usage" not in data for _, data in frames[:-1])
    assert frames[-2][1]["choices"][0]["finish_reason"] == "stop"


async def test_sdk_stream_reassembles_text(harness: Harness) -> None:
    stream = await harness.openai.chat.completions.create(
        model=MODEL, messages=USER, stream=True, stream_options={"include_usage": True}
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert (text, finish) == ("Hello there!", "stop")
    assert usage is not None and usage.prompt_tokens > 0


async def test_stop_strings_and_max_tokens() -> None:
    h = make_harness(FakeEngine(reply("alpha beta gamma")))
    stopped = await h.openai.chat.completions.create(model=MODEL, messages=USER, stop=["gam", "zzz"])
    assert stopped.choices[0].message.content == "alpha beta "
    assert stopped.choices[0].finish_reason == "stop"
    cut = await h.openai.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=5)
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ("alpha", "length")
    assert cut.usage.completion_tokens == 5
    zero = await h.openai.chat.completions.create(model=MODEL, messages=USER, max_tokens=0)
    assert (zero.choices[0].message.content, zero.choices[0].finish_reason) == ("", "length")


async def test_stream_never_leaks_a_partial_stop_string() -> None:
    h = make_harness(FakeEngine(reply("abc<EN<END>tail")))
    frames = await h.sse(
        "/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True, "stop": "<END>"}
    )
    deltas = [d["choices"][0]["delta"].get("content") for _, d in frames[1:-2]]
    assert "".join(deltas) == "abc<EN"
    assert all("<END" not in d for d in deltas)
    assert frames[-2][1]["choices"][0]["finish_reason"] == "stop"


async def test_multibyte_text_is_never_split() -> None:
    h = make_harness(FakeEngine(reply("日本語 🎉")))
    frames = await h.sse("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True})
    deltas = [d["choices"][0]["delta"]["content"] for _, d in frames[1:-2]]
    assert "".join(deltas) == "日本語 🎉" and all("\ufffd" not in d for d in deltas)


async def test_message_shapes_reach_the_prompt(harness: Harness) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "result!"},
        {"role": "system", "content": "late system"},
    ]
    await harness.openai.chat.completions.create(
        model=MODEL,
        messages=messages,
        user="u",
        metadata={"a": "b"},
        store=False,
        extra_body={"prompt_cache_key": "k"},
    )
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt
    assert "part one, two" in prompt
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>' in prompt
    )
    assert "<|im_start|>user\n<tool_response>\nresult!\n</tool_response><|im_end|>" in prompt
    assert "<|im_start|>system\nlate system<|im_end|>" in prompt


async def test_sampling_fields_reach_the_engine(harness: Harness) -> None:
    await harness.openai.chat.completions.create(
        model=MODEL,
        messages=USER,
        temperature=0.0,
        top_p=0.5,
        seed=7,
        presence_penalty=0.5,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1},
    )
    params = harness.engine.requests[0][1]
    assert (params.temperature, params.top_p, params.seed, params.top_k, params.min_p) == (
        0.0,
        0.5,
        7,
        5,
        0.1,
    )
    assert (params.presence_penalty, params.repetition_penalty) == (0.5, 1.1)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "stream": "true"}, "stream"),
        ({"messages": USER, "top_p": 7}, "top_p"),
        ({"messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    }
                ]
            },
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                        ],
                    }
                ]
            },
            "messages.0.content.0",  # three zero bytes: not a PNG
        ),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": USER, "reasoning_effort": "banana"}, "reasoning_effort"),
    ],
)
async def test_bad_requests_are_openai_400s(harness: Harness, body: dict, param: str) -> None:
    response = await harness.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert set(error) >= {"message", "type", "param", "code"}


async def test_context_length_exceeded_shape() -> None:
    h = make_harness(FakeEngine(reply("x")), ctx=32)
    response = await h.http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 50}]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["n_ctx"] == 32 and error["n_prompt_tokens"] >= 50
    n = error["n_prompt_tokens"]
    assert error["message"] == f"Prompt has {n} tokens, but the configured context size is 32 tokens"
    assert not h.engine.requests


async def test_sdk_raises_bad_request_on_context_overflow() -> None:
    import openai

    h = make_harness(FakeEngine(reply("x")), ctx=32)
    with pytest.raises(openai.BadRequestError) as info:
        await h.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 50}])
    assert info.value.code == "context_length_exceeded"


async def test_engine_failure_mid_stream_ends_with_an_error_event() -> None:
    import openai

    h = make_harness(FakeEngine(reply("abcdef"), fail_after=3))
    frames = await h.sse("/v1/chat/completions", {"messages": USER, "stream": True})
    assert frames[-2][1]["error"]["type"] == "server_error" and frames[-1][1] == "[DONE]"
    with pytest.raises(openai.APIError):
        async for _ in await h.openai.chat.completions.create(model=MODEL, messages=USER, stream=True):
            pass
    response = await h.http.post("/v1/chat/completions", json={"messages": USER})
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"


async def test_keepalive_comments_during_a_slow_prefill() -> None:
    h = make_harness(FakeEngine(reply("ok"), prefill_delay_s=0.3), keepalive_s=0.05)
    response = await h.http.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    assert response.text.count(": keepalive\n\n") >= 3
    assert response.text.endswith("data: [DONE]\n\n")
