"""`--api-key`: a pure ASGI middleware (streams pass through untouched) checking every route
except the liveness probes and the web console's static files (the page holds no data: it asks
for the key and sends it on every API call). Accepts `Authorization: Bearer <key>` and
`x-api-key: <key>`."""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from kvserve.api.console.routes import STATIC_PREFIX
from kvserve.api.errors import anthropic_error_body, is_anthropic_path, openai_error_body

_OPEN_PATHS = {"/health"}
_PROBE_PATHS = {"/api/hello"}  # Claude Code's preconnect, sent without a key


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._is_open(scope) or self._has_key(scope):
            await self.app(scope, receive, send)
            return
        message = "invalid or missing API key"
        path = scope["path"]
        body = (
            anthropic_error_body(401, message) if is_anthropic_path(path) else openai_error_body(401, message)
        )
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    @staticmethod
    def _is_open(scope: Scope) -> bool:
        path = scope["path"]
        is_page = scope["method"] in ("GET", "HEAD") and (path == "/" or path.startswith(STATIC_PREFIX + "/"))
        is_probe = scope["method"] == "HEAD" and path in _PROBE_PATHS
        return path in _OPEN_PATHS or is_page or is_probe or scope["method"] == "OPTIONS"

    def _has_key(self, scope: Scope) -> bool:
        return has_api_key(scope["headers"], self.api_key)


def has_api_key(raw_headers: Iterable[tuple[bytes, bytes]], api_key: bytes) -> bool:
    """Whether the headers (lower-case names) carry the key, as `x-api-key` or a Bearer token."""
    headers = dict(raw_headers)
    candidates = [headers.get(b"x-api-key", b"")]
    authorization = headers.get(b"authorization", b"")
    if authorization[:7].lower() == b"bearer ":
        candidates.append(authorization[7:].strip())
    return any(hmac.compare_digest(c, api_key) for c in candidates if c)
