"""What a request carries that says where it should go: its session, the response it continues,
and the block hashes of its prompt. Read once by the ingress from the headers and the body; a body
that does not parse gives empty keys (the replica answers it with the protocol's 4xx)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvserve.cluster.prefix_blocks import block_hashes, prompt_units

SessionSource = Literal[
    "claude_code_header", "codex_header", "x_session_id", "anthropic_metadata", "prompt_cache_key", "client"
]
# Headers agents send, highest first. Claude Code: `X-Claude-Code-Session-Id`. Codex 0.171: `session-id`
# and `thread-id` (older Codex: `session_id`, `conversation_id`). Anyone: `x-session-id`.
_SESSION_HEADERS: tuple[tuple[str, SessionSource], ...] = (
    ("x-claude-code-session-id", "claude_code_header"),
    ("session-id", "codex_header"),
    ("session_id", "codex_header"),
    ("conversation-id", "codex_header"),
    ("conversation_id", "codex_header"),
    ("thread-id", "codex_header"),
    ("x-session-id", "x_session_id"),
)
_GENERATION_PATHS = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/completions"})
# The web console and its JSON API: one browser should keep seeing one replica's records.
_CONSOLE_PREFIXES = ("/kvserve/", "/console")
# A response id minted by a cluster replica names the replica: `resp_<tag>_<hex>` (`response_id_prefix`).
_TAGGED_RESPONSE_ID = re.compile(r"^resp_([A-Za-z0-9]+)_[0-9a-f]+$")
_RESPONSE_PATH = re.compile(r"^/v1/responses/([^/]+)$")


@dataclass(frozen=True)
class RoutingKeys:
    """The router's arguments for one request (`ray_router` reads them from the handle call)."""

    session_id: str | None = None
    session_source: SessionSource | None = None
    replica_tag: str | None = None  # the replica that stored the response this request names
    prefix_hashes: tuple[int, ...] = ()

    @property
    def session_key(self) -> str | None:
        return None if self.session_id is None else f"{self.session_source}:{self.session_id}"


def response_id_prefix(replica_tag: str) -> str:
    """The prefix of the Responses ids a replica mints, so that a later `previous_response_id` (or a
    GET/DELETE of it) finds the replica that stored it without a table shared by routers."""
    return f"resp_{replica_tag}_"


def replica_tag_of(response_id: str) -> str | None:
    match = _TAGGED_RESPONSE_ID.match(response_id)
    return match.group(1) if match else None


def extract_routing_keys(
    method: str, path: str, headers: Mapping[str, str], body: bytes, client: str | None = None
) -> RoutingKeys:
    """`headers` with lower-case names. Never raises: what cannot be read is left out."""
    if path in _GENERATION_PATHS and method == "POST":
        return _generation_keys(path, headers, _json_object(body))
    stored = _RESPONSE_PATH.match(path)
    if stored:
        return RoutingKeys(replica_tag=replica_tag_of(stored.group(1)))
    if client and (path == "/" or path.startswith(_CONSOLE_PREFIXES)):
        return RoutingKeys(session_id=client, session_source="client")
    return RoutingKeys()


def _generation_keys(path: str, headers: Mapping[str, str], body: dict[str, Any] | None) -> RoutingKeys:
    session_id, source = _header_session(headers)
    if session_id is None and body is not None:
        session_id, source = _body_session(body)
    tag = None
    if body is not None and path == "/v1/responses":
        previous = body.get("previous_response_id")
        tag = replica_tag_of(previous) if isinstance(previous, str) else None
    hashes = block_hashes(prompt_units(path, body)) if body is not None else ()
    return RoutingKeys(session_id=session_id, session_source=source, replica_tag=tag, prefix_hashes=hashes)


def _header_session(headers: Mapping[str, str]) -> tuple[str | None, SessionSource | None]:
    for name, source in _SESSION_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            return value, source
    return None, None


def _body_session(body: dict[str, Any]) -> tuple[str | None, SessionSource | None]:
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        # Claude Code puts `{"device_id":…,"session_id":…}` as JSON text in metadata.user_id.
        user = _json_object(metadata["user_id"].encode())
        if user is not None and isinstance(user.get("session_id"), str) and user["session_id"]:
            return user["session_id"], "anthropic_metadata"
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key, "prompt_cache_key"
    return None, None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
