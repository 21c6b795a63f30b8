"""visit_page is offered only with a Chromium binary; with one, it returns a page's text."""

from __future__ import annotations

import http.server
import threading

import pytest

from kvserve.agent.tools.base import ToolContext
from kvserve.agent.tools.web import find_browser, web_tools
from kvserve.agent.workspace import Workspace


def test_without_a_browser_there_is_no_visit_page(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert web_tools(ToolContext(Workspace.create(tmp_path))) == []


@pytest.mark.skipif(
    find_browser() is None, reason="no Chromium on PATH (apt-get install chromium; .ci/run does)"
)
def test_visit_page_returns_the_text_of_a_page(tmp_path) -> None:
    from kvserve.agent.tools.base import Args

    (tmp_path / "index.html").write_text(
        "<html><body><h1>Hello</h1><script>document.body.append('from js')</script></body></html>"
    )
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tool,) = web_tools(ToolContext(Workspace.create(tmp_path)))
    try:
        text = tool.handler(Args("visit_page", {"url": f"http://127.0.0.1:{server.server_port}/"}))
        assert "Hello" in text and "from js" in text
    finally:
        tool.handler.__self__.browser.close()  # the PageVisitor's
        server.shutdown()
