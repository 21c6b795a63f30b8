"""Security headers, as a pure ASGI middleware (streams pass through untouched).

Every response says `X-Content-Type-Options: nosniff` (a JSON body or an SSE stream is never sniffed
into HTML) and `Referrer-Policy: no-referrer`. The web console's page and static files also carry a
content security policy that lets the page run only its own module scripts: no inline script or
event handler, no `style` attribute, no eval, no plugin, no other origin, no framing, and Trusted
Types, so that no string can reach an HTML sink (`innerHTML`) even through a bug in the page. Model
output is text there (`textContent`); the policy is the second wall. `/docs` (Swagger UI, whose page
loads its script from a CDN) keeps FastAPI's own headers.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.api.console.routes import STATIC_PREFIX

# One directive a line; `img-src data:` because attached images are shown from data: URIs.
_CSP_DIRECTIVES = [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "require-trusted-types-for 'script'",
    "trusted-types 'none'",
]
CONSOLE_CSP = "; ".join(_CSP_DIRECTIVES)
_EVERY_RESPONSE = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
_CONSOLE = [
    (b"content-security-policy", CONSOLE_CSP.encode()),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers that predate it
    (b"cross-origin-opener-policy", b"same-origin"),
]


def is_console_path(path: str) -> bool:
    return path == "/" or path.startswith(STATIC_PREFIX + "/")


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = _EVERY_RESPONSE + (_CONSOLE if is_console_path(scope["path"]) else [])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                added = [(name, value) for name, value in extra if name not in names]
                message["headers"] = [*message.get("headers", []), *added]
            await send(message)

        await self.app(scope, receive, send_with_headers)
