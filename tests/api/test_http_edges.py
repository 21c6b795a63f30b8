"""Body parsing, error shapes, auth, CORS and the small routes: every client mistake is a 4xx."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

ROUTES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/messages": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
}


def _assert_error_shape(path: str, response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}
        return body["error"]
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b"not json",
        b"",
        b"[]",
        b'"str"',
        b'{"messages": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": 1,}',
        b"\xff\xfe{}",
    ],
)
async def test_malformed_bodies_are_400(harness: Harness, path: str, raw: bytes) -> None:
    response = await harness.http.post(path, content=raw, headers={"content-type": "application/json"})
    _assert_error_shape(path, response, 400)


@pytest.mark.parametrize("path", ROUTES)
async def test_nesting_limit(harness: Harness, path: str) -> None:
    ok = {**ROUTES[path], "extra": json.loads("[" * 255 + "]" * 255)}  # depth 256 with the body object
    assert (await harness.http.post(path, json=ok)).status_code == 200
    deep = json.dumps(ROUTES[path])[:-1] + ', "extra": ' + "[" * 256 + "]" * 256 + "}"
    _assert_error_shape(path, await harness.http.post(path, content=deep), 400)
    very_deep = '{"extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    _assert_error_shape(path, await harness.http.post(path, content=very_deep), 400)


async def test_lone_surrogates_become_replacement_characters(harness: Harness) -> None:
    raw = b'{"messages": [{"role": "user", "content": "a\\ud800b\\udc00c \\ud83d\\ude00"}]}'
    response = await harness.http.post("/v1/chat/completions", content=raw)
    assert response.status_code == 200
    prompt = harness.service.detokenize(harness.engine.requests[0][0])
    assert "a\ufffdb\ufffdc \U0001f600" in prompt


async def test_duplicate_keys_last_wins(harness: Harness) -> None:
    raw = (
        b'{"messages": [{"role": "user", "content": "first", "content": "second"}],'
        b' "stream": true, "stream": false}'
    )
    response = await harness.http.post("/v1/chat/completions", content=raw)
    assert response.status_code == 200 and response.json()["object"] == "chat.completion"
    assert "second" in harness.service.detokenize(harness.engine.requests[0][0])


@pytest.mark.parametrize("path", ROUTES)
async def test_body_over_the_limit_is_413(path: str) -> None:
    h = make_harness(FakeEngine(reply("x")), max_body_bytes=1000)
    body = {**ROUTES[path], "pad": "x" * 2000}
    _assert_error_shape(path, await h.http.post(path, json=body), 413)


async def test_unknown_route_and_wrong_method(harness: Harness) -> None:
    _assert_error_shape("/nope", await harness.http.get("/nope"), 404)
    _assert_error_shape("/v1/chat/completions", await harness.http.get("/v1/chat/completions"), 405)
    error = _assert_error_shape("/v1/messages", await harness.http.get("/v1/messages"), 405)
    assert error["type"] == "invalid_request_error"
    _assert_error_shape("/v1/models", await harness.http.post("/v1/models", json={}), 405)


async def test_models_health_head_and_tokenize(harness: Harness) -> None:
    models = (await harness.http.get("/v1/models?x=1")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert models["data"][0]["context_length"] == 4096
    assert models["data"][0]["modalities"] == {"vision": False, "audio": False}  # a text model
    defaults = models["data"][0]["sampling_defaults"]  # a service without defaults: the APIs' own
    assert defaults["values"]["temperature"] == 1.0 and defaults["sources"] == {}
    listed = await harness.openai.models.list()
    assert [m.id for m in listed.data] == [MODEL]
    assert (await harness.http.get(f"/v1/models/{MODEL}")).json()["id"] == MODEL
    _assert_error_shape("/v1/models/other", await harness.http.get("/v1/models/other"), 404)
    assert (await harness.http.get("/health")).json() == {"status": "ok"}
    assert (await harness.http.head("/")).status_code == 200
    tokens = (await harness.http.post("/tokenize", json={"prompt": "hé"})).json()
    assert tokens["tokens"] == list("hé".encode()) and tokens["count"] == 3
    assert (await harness.http.post("/detokenize", json={"tokens": tokens["tokens"]})).json() == {
        "prompt": "hé"
    }
    _assert_error_shape("/detokenize", await harness.http.post("/detokenize", json={"tokens": [10**9]}), 400)
    _assert_error_shape("/detokenize", await harness.http.post("/detokenize", json={"tokens": ["a"]}), 400)
    openapi = (await harness.http.get("/openapi.json")).json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
        assert "requestBody" in openapi["paths"][path]["post"], path
    docs = await harness.http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower() and "/openapi.json" in docs.text


async def test_api_key_is_checked_on_every_route_but_health() -> None:
    h = make_harness(FakeEngine(reply("ok")), api_key="sekret")
    _assert_error_shape("/v1/models", await h.http.get("/v1/models"), 401)
    error = _assert_error_shape(
        "/v1/messages", await h.http.post("/v1/messages", json=ROUTES["/v1/messages"]), 401
    )
    assert error["type"] == "authentication_error"
    wrong = await h.http.get("/v1/models", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert (await h.http.get("/v1/models", headers={"authorization": "Bearer sekret"})).status_code == 200
    assert (await h.http.get("/v1/models", headers={"x-api-key": "sekret"})).status_code == 200
    assert (await h.http.get("/health")).status_code == 200
    assert (await h.http.head("/api/hello")).status_code == 200  # Claude Code's keyless preconnect
    assert (await h.http.get("/api/hello")).status_code == 401  # only the HEAD probe is open
    # The SDKs send their key in their own header: both must get through.
    h.openai.api_key = "sekret"
    assert await h.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    h.anthropic.api_key = "sekret"
    assert await h.anthropic.messages.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )


async def test_cors_is_off_by_default_and_on_with_the_flag(harness: Harness) -> None:
    headers = {"origin": "http://example.com"}
    assert (
        "access-control-allow-origin" not in (await harness.http.get("/v1/models", headers=headers)).headers
    )
    h = make_harness(FakeEngine(reply("ok")), cors=True, api_key="k")
    response = await h.http.get("/v1/models", headers=headers)
    assert response.status_code == 401 and response.headers["access-control-allow-origin"] == "*"
    preflight = await h.http.options(
        "/v1/chat/completions",
        headers={
            **headers,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization",
        },
    )
    assert preflight.status_code == 200 and "access-control-allow-methods" in preflight.headers


async def test_request_ids_are_echoed_and_reach_the_engine(harness: Harness) -> None:
    response = await harness.http.post(
        "/v1/chat/completions", json=ROUTES["/v1/chat/completions"], headers={"x-request-id": "client-42"}
    )
    assert response.headers["x-request-id"] == "client-42"
    assert harness.engine.request_ids[-1].startswith("client-42-")
    generated = (await harness.http.get("/v1/models")).headers["x-request-id"]
    assert len(generated) == 32
    odd = await harness.http.get("/v1/models", headers={"x-request-id": "bad id\twith spaces"})
    assert odd.headers["x-request-id"] != "bad id\twith spaces"


async def test_metrics_count_requests_tokens_and_latency(harness: Harness) -> None:
    await harness.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    await harness.http.get("/nope")
    text = (await harness.http.get("/metrics")).text
    assert 'kvserve_http_requests_total{path="/v1/chat/completions",status="200"} 1.0' in text
    assert 'kvserve_http_requests_total{path="other",status="404"} 1.0' in text
    n_prompt = len(harness.engine.requests[0][0])
    assert f"kvserve_prompt_tokens_total {float(n_prompt)}" in text
    assert f"kvserve_generation_tokens_total {float(len(reply('Hello there!')))}" in text
    assert "kvserve_time_to_first_token_seconds_count 1.0" in text
    assert "kvserve_generations_in_flight 0.0" in text


async def test_engine_gauges_come_from_the_stats_source() -> None:
    import httpx

    from kvserve.api.app import create_app
    from kvserve.serving.chat_service import ChatService
    from kvserve.serving.chat_settings import ChatServiceSettings
    from kvserve.serving.engine_stats import EngineStats
    from tests.api.fake_engine import FakeTokenizerInfo

    service = ChatService(
        FakeEngine(reply("x")), FakeTokenizerInfo(), ChatServiceSettings(model_name=MODEL, max_model_len=64)
    )
    app = create_app(service, engine_stats=lambda: EngineStats(3, 2, 0.25, 0.5))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        text = (await client.get("/metrics")).text
    for line in (
        "kvserve_num_running_seqs 3.0",
        "kvserve_num_waiting_seqs 2.0",
        "kvserve_kv_cache_usage 0.25",
        "kvserve_prefix_cache_hit_rate 0.5",
    ):
        assert line in text
