"""Request ids and one structured access-log line per request (pure ASGI: streams pass through).

The id comes from the client's `x-request-id` when it sends a sane one, else a new one; it is
echoed in the response header and becomes the engine request id, so one id follows a request
from the access log into the engine's logs.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("kvserve.access")
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The web console polls these every second or two: their successes are logged at DEBUG, not INFO.
_QUIET_PREFIXES = ("/kvserve/v1/", "/console/")


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SANE_ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.monotonic()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            metrics = getattr(getattr(scope.get("app"), "state", None), "metrics", None)
            if metrics is not None:
                metrics.count_request(scope["path"], status)
            is_quiet = status < 400 and scope["path"].startswith(_QUIET_PREFIXES)
            logger.log(
                logging.DEBUG if is_quiet else logging.INFO,
                "request_id=%s method=%s path=%s status=%d duration_ms=%.1f client=%s",
                request_id,
                scope["method"],
                scope["path"],
                status,
                (time.monotonic() - started) * 1000,
                (scope.get("client") or ("-",))[0],
            )
