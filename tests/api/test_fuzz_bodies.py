"""Thousands of malformed or odd bodies across the POST routes: only 2xx/4xx, and the server lives on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply

MESSAGES = [{"role": "user", "content": "hi"}]
VALID = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 4},
    "/v1/messages/count_tokens": {"messages": MESSAGES},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [104, 105]},
}
FIELDS = [
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_output_tokens",
    "stream",
    "stop",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "n",
    "tools",
    "tool_choice",
    "system",
    "instructions",
    "reasoning",
    "reasoning_effort",
    "thinking",
    "stream_options",
    "logprobs",
    "tokens",
    "model",
    "response_format",
    "text",
    "previous_response_id",
    "output_config",
    "ignore_eos",
    "logit_bias",
    "top_logprobs",
    "max_completion_tokens",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
]

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["user", "assistant", "tool", "text", "function", "auto"])
)
json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "name",
                    "tool_calls",
                    "function",
                    "arguments",
                    "id",
                    "input",
                    "tool_use_id",
                    "call_id",
                    "output",
                    "image_url",
                    "url",
                    "source",
                    "0",  # logit_bias keys: a token id, and one outside every vocabulary
                    "9999999",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(VALID)))
    kind = draw(st.integers(0, 3))
    if kind == 0:  # a valid body with one field replaced by anything
        body: Any = {**VALID[path], draw(st.sampled_from(FIELDS)): draw(json_values)}
    elif kind == 1:  # a valid body with a message replaced by anything
        body = {**VALID[path], "messages": [draw(json_values)], "input": [draw(json_values)]}
    elif kind == 2:  # any JSON at all
        body = draw(json_values)
    else:  # raw bytes, including broken UTF-8 and JSON fragments
        raw = draw(st.binary(max_size=64) | st.sampled_from([b'{"a": NaN}', b'{"x": "\\ud800"}', b"[" * 300]))
        return path, raw
    return path, json.dumps(body).encode()


def test_fuzzed_bodies_never_give_5xx() -> None:
    engine = FakeEngine(reply("ok"))
    app = create_app(
        ChatService(engine, FakeTokenizerInfo(), ChatServiceSettings(model_name="fake", max_model_len=512)),
        ApiSettings(served_model_name="fake"),
    )
    statuses: list[int] = []
    # The app over httpx's in-process ASGI transport, on one loop: an exception in it still becomes
    # a 500 response. Starlette's TestClient spent ~10 ms a request on its thread portal (a minute
    # of the 2,500 here), the app ~1 ms.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=transport, base_url="http://fuzz")
    loop = asyncio.new_event_loop()

    def post(path: str, **kwargs: Any) -> httpx.Response:
        return loop.run_until_complete(client.post(path, **kwargs))

    try:

        @settings(
            max_examples=2500,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(bodies())
        def check(case: tuple[str, bytes]) -> None:
            path, raw = case
            response = post(path, content=raw, headers={"content-type": "application/json"})
            statuses.append(response.status_code)
            assert response.status_code < 500, (path, raw[:300], response.text[:300])

        check()
        assert loop.run_until_complete(client.get("/health")).status_code == 200
        assert post("/v1/chat/completions", json=VALID["/v1/chat/completions"]).status_code == 200
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
    assert len(statuses) >= 2000
    assert {200, 400} <= set(statuses)
    assert not engine.running
