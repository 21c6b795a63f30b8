"""The routing keys the ingress reads from what real agents send (tests/fixtures' first requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.cluster.prefix_blocks import BLOCK_BYTES, block_hashes, prompt_units
from kvserve.cluster.routing_keys import (
    RoutingKeys,
    extract_routing_keys,
    replica_tag_of,
    response_id_prefix,
)

CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def _fixture(name: str) -> tuple[dict[str, str], bytes]:
    meta = json.loads((CLIENTS / f"{name}.meta.json").read_text())
    headers = {k.lower(): v for k, v in meta["headers"].items()}
    return headers, (CLIENTS / f"{name}.json").read_bytes()


needs_fixtures = pytest.mark.skipif(not CLIENTS.is_dir(), reason=f"no client fixtures at {CLIENTS}")


@needs_fixtures
def test_claude_code_session_header() -> None:
    headers, body = _fixture("claude-code-2.1.332_messages")
    keys = extract_routing_keys("POST", "/v1/messages", headers, body)
    assert keys.session_id == "24cb6efd-1f8a-4cf5-b844-9dae7142211b"
    assert keys.session_source == "claude_code_header"
    assert len(keys.prefix_hashes) > 30  # ~50 KB of prompt


@needs_fixtures
def test_claude_code_without_the_header_uses_metadata_user_id() -> None:
    headers, body = _fixture("claude-code-2.1.197-bare_messages")
    del headers["x-claude-code-session-id"]
    keys = extract_routing_keys("POST", "/v1/messages", headers, body)
    assert (keys.session_id, keys.session_source) == (
        "684c8bb6-e640-4460-85e4-2d0025d61ce4",
        "anthropic_metadata",
    )


@needs_fixtures
def test_codex_session_header_then_prompt_cache_key() -> None:
    headers, body = _fixture("codex-0.171.0_responses")
    keys = extract_routing_keys("POST", "/v1/responses", headers, body)
    assert (keys.session_id, keys.session_source) == ("01a2361f-b8d9-7b23-b15a-8ce014504a4e", "codex_header")
    bare = {k: v for k, v in headers.items() if k not in ("session-id", "thread-id")}
    keys = extract_routing_keys("POST", "/v1/responses", bare, body)
    assert (keys.session_id, keys.session_source) == (
        "01a2361f-b8d9-7b23-b15a-8ce014504a4e",
        "prompt_cache_key",
    )


def test_older_codex_and_generic_headers() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    for name in ("session_id", "conversation_id", "x-session-id"):
        keys = extract_routing_keys("POST", "/v1/chat/completions", {name: "abc"}, body)
        assert keys.session_id == "abc", name
    assert extract_routing_keys("POST", "/v1/chat/completions", {}, body).session_key is None


def test_previous_response_id_names_the_replica_that_stored_it() -> None:
    response_id = response_id_prefix("zsumf2en") + "155888bc22354105bb066e7e26abfe16"
    assert replica_tag_of(response_id) == "zsumf2en"
    assert replica_tag_of("resp_155888bc22354105bb066e7e26abfe16") is None  # a single server's id
    body = json.dumps({"model": "m", "input": "go on", "previous_response_id": response_id}).encode()
    assert extract_routing_keys("POST", "/v1/responses", {}, body).replica_tag == "zsumf2en"
    assert extract_routing_keys("GET", f"/v1/responses/{response_id}", {}, b"").replica_tag == "zsumf2en"
    assert extract_routing_keys("DELETE", f"/v1/responses/{response_id}", {}, b"").replica_tag == "zsumf2en"


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b'{"messages": 5}', b"\xff\xfe", b"[" * 100_000])
def test_bad_bodies_give_empty_keys_never_an_error(body: bytes) -> None:
    keys = extract_routing_keys("POST", "/v1/chat/completions", {}, body)
    assert keys.prefix_hashes == () and keys.session_id is None


def test_console_requests_stick_to_the_client() -> None:
    keys = extract_routing_keys("GET", "/kvserve/v1/requests", {}, b"", client="10.0.0.7")
    assert keys == RoutingKeys(session_id="10.0.0.7", session_source="client")
    assert extract_routing_keys("GET", "/v1/models", {}, b"", client="10.0.0.7") == RoutingKeys()


def test_a_later_turn_starts_with_the_earlier_turns_blocks() -> None:
    history = [{"role": "user", "content": "x" * 3000}]
    turn1 = block_hashes(prompt_units("/v1/chat/completions", {"messages": history}))
    history += [{"role": "assistant", "content": "y" * 2000}, {"role": "user", "content": "z" * 10}]
    turn2 = block_hashes(prompt_units("/v1/chat/completions", {"messages": history}))
    assert len(turn1) == 3000 // BLOCK_BYTES and turn2[: len(turn1)] == turn1 and len(turn2) > len(turn1)


def test_billing_header_and_cache_control_do_not_change_the_blocks() -> None:
    def body(billing: str, marked: bool) -> dict:
        text = {
            "type": "text",
            "text": "t" * 5000,
            **({"cache_control": {"type": "ephemeral"}} if marked else {}),
        }
        system = [
            {"type": "text", "text": f"x-anthropic-billing-header: {billing}"},
            {"type": "text", "text": "s"},
        ]
        return {"system": system, "messages": [{"role": "user", "content": [text]}]}

    first = block_hashes(prompt_units("/v1/messages", body("cch=1", True)))
    assert first == block_hashes(prompt_units("/v1/messages", body("cch=2", False))) and first
