"""The console's surface without a browser (issue 37): security headers on the page and its files;
no inline script, handler or style attribute in the page; every data route behind the key, however
its path is spelled on the wire; no path reaches a file outside the console's static folder.

Raw requests go through `http.client` on a live port, which sends the path exactly as written (an
HTTP library would normalize `..` away before the server saw it).
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest

from kvserve.api.app import create_app
from kvserve.api.console.routes import STATIC_DIR
from kvserve.api.security_headers import CONSOLE_CSP
from kvserve.api.settings import ApiSettings
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.live_uvicorn import serve_in_thread

KEY = "console-secret"
STATIC_FILES = {path.read_bytes() for path in STATIC_DIR.iterdir()}
# Ways to spell a data route (or a file outside the static folder) that a careless prefix check or
# file server would let through.
SNEAKY_PATHS = [
    "/console/../kvserve/v1/cache",
    "/console/%2e%2e/kvserve/v1/cache",
    "/console/..%2fkvserve/v1/cache",
    "/console/%2e%2e%2fkvserve%2fv1%2fcache",
    "/console/..%5ckvserve/v1/cache",
    "//kvserve/v1/cache",
    "/kvserve/v1/cache/",
    "/kvserve//v1/cache",
    "/KVSERVE/v1/cache",
    "/./kvserve/v1/cache",
    "/console/../../../../etc/passwd",
    "/console/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/console/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/console/%252e%252e/%252e%252e/etc/passwd",
    "/console//etc/passwd",
    "/console/%2fetc%2fpasswd",
    "/console/app.js%00.html",
    "/console/../routes.py",
    "/console/%2e%2e/routes.py",
]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    service = ChatService(
        FakeEngine(reply("ok")), FakeTokenizerInfo(), ChatServiceSettings(model_name="m", max_model_len=4096)
    )
    app = create_app(service, ApiSettings(served_model_name="m", api_key=KEY))
    with serve_in_thread(app) as (url, _):
        yield int(url.rsplit(":", 1)[1])


def raw(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("path", ["/", "/console/app.js", "/console/chat.js", "/console/style.css"])
def test_the_page_and_its_files_carry_the_security_headers(port: int, path: str) -> None:
    status, headers, _ = raw(port, "GET", path)
    assert status == 200  # the page loads without the key: it holds no data
    csp = headers["content-security-policy"]
    assert csp == CONSOLE_CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert "unsafe" not in csp and directives["require-trusted-types-for"] == "'script'"
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"


def test_api_responses_are_never_sniffed_and_keep_their_own_policy(port: int) -> None:
    for path, expected in (("/v1/models", 401), ("/health", 200), ("/docs", 401)):
        status, headers, _ = raw(port, "GET", path)
        assert status == expected and headers["x-content-type-options"] == "nosniff", path
        assert "content-security-policy" not in headers  # /docs is Swagger UI's page (CDN script)


class _PageAudit(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script" and "src" not in names:
            self.problems.append("inline <script>")
        self.problems += [f"<{tag} {n}>" for n in names if n.startswith("on") or n == "style"]
        self.problems += [
            f"<{tag} {n}=javascript:>" for n, v in attrs if (v or "").lower().startswith("javascript:")
        ]
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("script text")


def test_the_page_has_no_inline_script_handler_or_style() -> None:
    audit = _PageAudit()
    audit.feed((STATIC_DIR / "index.html").read_text())
    assert audit.problems == []


def _data_routes() -> list[tuple[str, str]]:
    """(method, path) of every route in the app's OpenAPI document, a value for each path parameter."""
    service = ChatService(
        FakeEngine(()), FakeTokenizerInfo(), ChatServiceSettings(model_name="m", max_model_len=4096)
    )
    paths = create_app(service, ApiSettings(api_key=KEY)).openapi()["paths"]
    routes = []
    for path, operations in paths.items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        routes += [(method.upper(), concrete) for method in operations]
    # Open by design: the page, the liveness probe and Claude Code's keyless HEAD preconnect.
    open_routes = {
        ("GET", "/"),
        ("HEAD", "/"),
        ("GET", "/health"),
        ("HEAD", "/health"),
        ("HEAD", "/api/hello"),
    }
    return sorted(set(routes) - open_routes)


def test_every_route_but_the_page_and_health_needs_the_key(port: int) -> None:
    routes = _data_routes()
    assert ("GET", "/kvserve/v1/cache/checkpoints") in routes and ("GET", "/kvserve/v1/requests/x") in routes
    for method, path in routes:
        status, _, body = raw(port, method, path)
        assert status == 401, (method, path, status, body[:200])
        if path.startswith("/kvserve/"):
            status, _, _ = raw(port, method, path, {"authorization": f"Bearer {KEY}"})
            assert status != 401, (method, path)


@pytest.mark.parametrize("path", SNEAKY_PATHS)
def test_no_spelling_of_a_path_gets_data_or_a_file_without_the_key(port: int, path: str) -> None:
    for method in ("GET", "HEAD"):
        status, _, body = raw(port, method, path)
        assert status in (400, 401, 404, 405), (method, path, status)
        assert b"root:" not in body and b"pool" not in body and b"ApiKeyMiddleware" not in body


@pytest.mark.parametrize("path", [p for p in SNEAKY_PATHS if "console" in p])
def test_no_spelling_of_a_static_path_reads_outside_the_static_folder_even_with_the_key(
    port: int, path: str
) -> None:
    status, _, body = raw(port, "GET", path, {"authorization": f"Bearer {KEY}"})
    assert status != 200 or body in STATIC_FILES, (path, status, body[:200])
    assert b"root:" not in body and b"def " not in body


@pytest.mark.parametrize(
    "response_id", ["..%2f..%2f..%2fetc%2fpasswd", "%2e%2e", "resp_..%5c..%5cx", "%00", "resp_%252e%252e"]
)
def test_a_path_like_response_id_is_only_an_unknown_id(port: int, response_id: str) -> None:
    """The other id-taking routes (`/v1/responses/{id}`, kept in SQLite): a 404 in the OpenAI shape."""
    for method in ("GET", "DELETE"):
        status, headers, body = raw(
            port, method, f"/v1/responses/{response_id}", {"authorization": f"Bearer {KEY}"}
        )
        assert status == 404 and headers["content-type"].startswith("application/json"), (
            method,
            status,
            body,
        )
        assert b'"error"' in body and b"root:" not in body
