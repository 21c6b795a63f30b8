"""tool_choice and response_format / text.format in the three APIs: the wire spellings reach the
engine as the right grammar constraint, `none` renders no tools, bad schemas are protocol-native 400s.
(FakeEngine: the constraint is recorded, not applied; tests/engine and tests/e2e apply it.)"""

from __future__ import annotations

from typing import Any

import pytest

from kvserve.grammar.constraint import GrammarConstraint
from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import EOS_ID, ByteTokenizer, FakeEngine, reply

PARAMS = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
USER = [{"role": "user", "content": "hi"}]


def _call(name: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"x": 1}}}}\n</tool_call>'


def _accepts(constraint: Any, text: str) -> bool:
    assert isinstance(constraint, GrammarConstraint)
    fresh = constraint  # each request has its own; consume it here
    return all(fresh.accept_token(t) for t in ByteTokenizer().encode(text)) and fresh.accept_token(EOS_ID)


@pytest.fixture
async def h():
    harness = make_harness(FakeEngine(reply("ok")))
    yield harness
    await harness.http.aclose()


def _openai_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": PARAMS}} for n in ("a", "b")]


def _anthropic_tools() -> list[dict[str, Any]]:
    return [{"name": n, "input_schema": PARAMS} for n in ("a", "b")]


def _responses_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "name": n, "parameters": PARAMS} for n in ("a", "b")]


async def _post(h: Harness, api: str, choice: Any, **extra: Any):
    if api == "chat":
        body = {"model": MODEL, "messages": USER, "tools": _openai_tools(), "tool_choice": choice}
        return await h.http.post("/v1/chat/completions", json={**body, **extra})
    if api == "messages":
        body = {
            "model": MODEL,
            "max_tokens": 32,
            "messages": USER,
            "tools": _anthropic_tools(),
            "tool_choice": choice,
        }
        return await h.http.post("/v1/messages", json={**body, **extra})
    body = {"model": MODEL, "input": "hi", "tools": _responses_tools(), "tool_choice": choice}
    return await h.http.post("/v1/responses", json={**body, **extra})


REQUIRED = {"chat": "required", "messages": {"type": "any"}, "responses": "required"}
NAMED_B = {
    "chat": {"type": "function", "function": {"name": "b"}},
    "messages": {"type": "tool", "name": "b"},
    "responses": {"type": "function", "name": "b"},
}
NAMED_UNKNOWN = {
    "chat": {"type": "function", "function": {"name": "zz"}},
    "messages": {"type": "tool", "name": "zz"},
    "responses": {"type": "function", "name": "zz"},
}


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_required_forces_a_call_to_any_tool(h: Harness, api: str) -> None:
    assert (await _post(h, api, REQUIRED[api])).status_code == 200
    assert _accepts(h.engine.constraints[-1], _call("b"))
    assert (await _post(h, api, REQUIRED[api])).status_code == 200
    assert not _accepts(h.engine.constraints[-1], _call("a") + "\n" + _call("b"))  # one call


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_named_choice_forces_one_call_to_that_tool(h: Harness, api: str) -> None:
    for text, ok in ((_call("b"), True), (_call("a"), False), (_call("b") + "\n" + _call("b"), False)):
        assert (await _post(h, api, NAMED_B[api])).status_code == 200
        assert _accepts(h.engine.constraints[-1], text) is ok, text


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_unknown_named_tool_is_a_400(h: Harness, api: str) -> None:
    response = await _post(h, api, NAMED_UNKNOWN[api])
    assert response.status_code == 400
    body = response.json()
    error = body["error"]
    assert "zz" in error["message"]
    assert body.get("type") == "error" if api == "messages" else error["param"] == "tool_choice"
    assert h.engine.requests == []


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_none_renders_no_tools_and_auto_masks_nothing(h: Harness, api: str) -> None:
    none = {"type": "none"} if api == "messages" else "none"
    assert (await _post(h, api, none)).status_code == 200
    prompt = ByteTokenizer().decode(h.engine.requests[-1][0])
    assert "<tools>" not in prompt and '"name": "a"' not in prompt
    assert h.engine.constraints[-1] is None
    auto = {"type": "auto"} if api == "messages" else "auto"
    assert (await _post(h, api, auto, temperature=0.7)).status_code == 200
    assert "<tools>" in ByteTokenizer().decode(h.engine.requests[-1][0])
    constraint = h.engine.constraints[-1]
    assert isinstance(constraint, GrammarConstraint) and not constraint.is_masking  # structural greedy only


async def test_required_without_tools_is_a_400(h: Harness) -> None:
    response = await h.http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": USER, "tool_choice": "required"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"


SCHEMA = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}


async def test_response_format_json_schema_chat_completions_responses(h: Harness) -> None:
    chat = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    bodies = [
        ("/v1/chat/completions", {"model": MODEL, "messages": USER, "response_format": chat}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "response_format": chat}),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": "hi",
                "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}},
            },
        ),
    ]
    for path, body in bodies:
        assert (await h.http.post(path, json=body)).status_code == 200, path
        assert _accepts(h.engine.constraints[-1], '{"k": "v"}'), path
    for path, body in bodies:
        assert (await h.http.post(path, json=body)).status_code == 200
        assert not _accepts(h.engine.constraints[-1], '{"j": "v"}'), path


async def test_json_object_mode_via_the_sdk(h: Harness) -> None:
    await h.openai.chat.completions.create(
        model=MODEL, messages=USER, response_format={"type": "json_object"}
    )
    assert _accepts(h.engine.constraints[-1], '{"any": [1, 2]}')
    await h.openai.responses.create(model=MODEL, input="hi", text={"format": {"type": "json_object"}})
    assert _accepts(h.engine.constraints[-1], '{"any": true}')
    await h.openai.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "text"})
    assert h.engine.constraints[-1] is None


BAD_SCHEMA = {"type": "object", "properties": {"k": {"type": 7}}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": USER,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": BAD_SCHEMA},
                },
            },
            "response_format",
        ),
        (
            "/v1/chat/completions",
            {"messages": USER, "response_format": {"type": "yaml"}},
            "response_format.type",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": USER,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": [1]}},
            },
            "response_format.json_schema.schema",
        ),
        (
            "/v1/completions",
            {
                "prompt": "hi",
                "response_format": {"type": "json_schema", "json_schema": {"schema": BAD_SCHEMA}},
            },
            "response_format",
        ),
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": BAD_SCHEMA}}},
            "response_format",
        ),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
async def test_bad_formats_are_openai_400s(h: Harness, path: str, body: dict[str, Any], param: str) -> None:
    response = await h.http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert h.engine.requests == []


async def test_bad_tool_schema_under_forced_choice_is_an_anthropic_400(h: Harness) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": USER,
        "tools": [{"name": "a", "input_schema": BAD_SCHEMA}],
        "tool_choice": {"type": "any"},
    }
    response = await h.http.post("/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"


async def test_a_constraint_failure_in_the_engine_is_a_failed_stream() -> None:
    from kvserve.engine.outputs import EngineOutput
    from kvserve.engine.request import FinishReason
    from kvserve.serving.events import Failed

    class _Failing(FakeEngine):
        async def generate(
            self, request_id, prompt_token_ids, params, constraint=None, checkpoint_hint=None, images=()
        ):
            yield EngineOutput(request_id, (ord("{"),), num_prompt_tokens=len(prompt_token_ids))
            yield EngineOutput(
                request_id, (ord("x"),), finish_reason=FinishReason.ERROR, error="token rejected"
            )

    harness = make_harness(_Failing())
    service = harness.service
    from kvserve.chat.conversation import ChatRequest, JsonFormat, Message, TextPart

    prepared = service.prepare_chat(
        ChatRequest((Message("user", (TextPart("hi"),)),), response_format=JsonFormat())
    )
    events = [e async for e in service.generate(prepared)]
    assert events[-1] == Failed("constrained decoding failed: token rejected")
    response = await harness.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "response_format": {"type": "json_object"}},
    )
    assert (
        response.status_code == 500 and "constrained decoding failed" in response.json()["error"]["message"]
    )
    await harness.http.aclose()
