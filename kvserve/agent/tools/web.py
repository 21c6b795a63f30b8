"""`visit_page`: the text of a web page, rendered by headless Chromium driven over the DevTools
protocol (JSON over a WebSocket). Offered only when a Chromium binary is installed."""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Any

from kvserve.agent.tools.base import Args, Tool, ToolContext, integer, schema, string
from kvserve.agent.workspace import ToolError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MAX_PAGE_CHARS = 32 << 10
START_TIMEOUT_S = 20.0
_LISTENING = re.compile(r"DevTools listening on (ws://[^\s]+)")


def _pump(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)
    lines.put("")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium per agent, started on first use and killed at exit."""

    def __init__(self, binary: str):
        self.binary = binary
        self.process: subprocess.Popen | None = None
        self.http_base = ""
        self.profile: str | None = None

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self.profile = profile = tempfile.mkdtemp(prefix="kvserve_agent_chromium_")
        # Chromium refuses to run as root with its sandbox (containers, CI): drop it there only.
        sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []
        self.process = subprocess.Popen(
            [self.binary, "--headless=new", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0",
             *sandbox, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        atexit.register(self.close)
        lines: queue.Queue[str] = queue.Queue()
        # Chromium logs to stderr for as long as it runs: keep reading it, or a full pipe blocks it.
        threading.Thread(target=_pump, args=(self.process.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        seen: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if match := _LISTENING.search(line):
                self.http_base = "http://" + match.group(1).split("/")[2]
                return
            if line == "":  # stderr closed: Chromium exited
                break
            seen.append(line.strip())
        self.close()
        detail = next((line for line in reversed(seen) if line), "no output")
        raise ToolError(f"visit_page: Chromium did not start ({detail[-300:]})")

    def page_text(self, url: str, timeout_s: float) -> str:
        from websockets.sync.client import connect

        self.start()
        request = urllib.request.Request(f"{self.http_base}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            target = json.load(response)
        try:
            with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
                session = _Cdp(ws)
                session.call("Page.enable")
                session.call("Page.navigate", url=url)
                session.wait_for("Page.loadEventFired", timeout_s)
                result = session.call(
                    "Runtime.evaluate",
                    expression="document.body ? document.body.innerText : ''",
                    returnByValue=True,
                )
                return str(result.get("result", {}).get("value", ""))
        finally:
            urllib.request.urlopen(f"{self.http_base}/json/close/{target['id']}", timeout=10).close()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.profile is not None:
            shutil.rmtree(self.profile, ignore_errors=True)
            self.profile = None


class _Cdp:
    def __init__(self, ws: Any):
        self.ws = ws
        self.next_id = 1
        self.seen: list[str] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = self.next_id
        self.next_id += 1
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == call_id:
                if "error" in message:
                    raise ToolError(f"visit_page: {method}: {message['error'].get('message')}")
                return message.get("result", {})
            self.seen.append(message.get("method", ""))

    def wait_for(self, event: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while event not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return  # a slow page: take what has rendered so far
            try:
                self.seen.append(json.loads(self.ws.recv(timeout=left)).get("method", ""))
            except TimeoutError:
                return


class PageVisitor:
    def __init__(self, ctx: ToolContext, browser: Browser):
        self.ctx = ctx
        self.browser = browser

    def visit(self, args: Args) -> str:
        url = args.text("url")
        if not re.match(r"^https?://", url):
            raise ToolError("visit_page: url must start with http:// or https://")
        text = self.browser.page_text(url, args.integer("timeout_sec", 20, 1, 120))
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        if len(text) > MAX_PAGE_CHARS:
            text = text[:MAX_PAGE_CHARS] + f"\n[… page cut at {MAX_PAGE_CHARS} of {len(text)} chars]"
        return f"{url}\n\n{text}" if text else f"{url}: the page has no text"


def web_tools(ctx: ToolContext, binary: str | None = None) -> list[Tool]:
    binary = binary or find_browser()
    if binary is None:
        return []
    visitor = PageVisitor(ctx, Browser(binary))
    return [
        Tool(
            "visit_page",
            "Open a web page in a headless browser and return its text.",
            schema(
                {"url": string("http(s) URL"), "timeout_sec": integer("page load timeout (default 20)")},
                ("url",),
            ),
            visitor.visit,
            needs_confirmation=True,
            summary_field="url",
        )
    ]
