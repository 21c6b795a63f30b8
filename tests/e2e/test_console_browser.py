"""The web console in a real headless Chromium (Playwright) against a live `kvserve serve` on the
default model: a streamed chat with its usage, a second prompt with the same prefix marked as
cached with its divergence point, and a dashboard that updates without a reload.

One server (with --api-key, so the page's key prompt is exercised) and one browser for the
module; short generations. Skips without Chromium or Playwright.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from tests.browser import browser_page, require_browser
from tests.serve_process import in_process_server

pytestmark = pytest.mark.model

sync_api = require_browser()

KEY = "console-test-key"
# Long enough that the shared prefix spans whole KV blocks (16 tokens) many times over.
SYSTEM = "You are a helpful assistant. Answer in one short sentence. " * 6


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kvserve-console-") as cache_dir:
        args = ["--api-key", KEY, "--kv-cache-dir", cache_dir, "--ctx", "2048", "--max-num-seqs", "4"]
        with in_process_server(args) as url:
            yield url


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[sync_api.Page]:
    with browser_page(sync_api) as page:
        page.goto(f"{server}/#chat")
        # The page itself loads without the key; its first API call (401) asks for it.
        page.locator("#key-dialog").wait_for(state="visible")
        page.fill("#key-input", KEY)
        page.click("#key-save")
        sync_api.expect(page.locator("#model-name")).to_contain_text("ctx 2048")
        yield page


def shoot(page: sync_api.Page, name: str) -> None:
    """With KVSERVE_CONSOLE_SCREENSHOTS=DIR, save the page as DIR/NAME.png (the README's pictures:
    `KVSERVE_CONSOLE_SCREENSHOTS=docs pytest tests/e2e/test_console_browser.py`)."""
    directory = os.environ.get("KVSERVE_CONSOLE_SCREENSHOTS")
    if directory:
        page.screenshot(path=os.path.join(directory, f"{name}.png"), full_page=True)


def send_chat(page: sync_api.Page, question: str) -> sync_api.Locator:
    """Ask in a fresh chat; returns the assistant message once its usage line is shown."""
    page.click("#clear")
    page.fill("#set-system", SYSTEM)
    page.fill("#set-max_tokens", "12")
    page.fill("#set-temperature", "0")
    page.fill("#chat-input", question)
    page.press("#chat-input", "Enter")
    message = page.locator(".msg.assistant").last
    sync_api.expect(message.locator(".usage")).to_be_visible(timeout=120_000)
    return message


def test_chat_streams_an_answer_with_usage(page: sync_api.Page) -> None:
    page.goto(page.url.split("#")[0] + "#chat")
    message = send_chat(page, "What is the capital of France?")
    assert message.locator(".content").inner_text().strip()
    usage = message.locator(".usage").inner_text()
    for part in ("prompt ", "cached ", "generated ", "TTFT ", "tok/s"):
        assert part in usage, usage
    assert "generated 0" not in usage
    assert page.locator(".msg.user").last.inner_text() == "What is the capital of France?"


def test_a_text_model_offers_no_image_attachment(page: sync_api.Page, server: str) -> None:
    """SmolLM2 takes no images (/v1/models modalities): no attach control, and a pasted image is
    not queued (the paste goes to the text box as usual)."""
    page.goto(server + "/#chat")
    sync_api.expect(page.locator("#model-name")).to_contain_text("ctx 2048")
    models = httpx.get(f"{server}/v1/models", headers={"x-api-key": KEY}).json()
    assert models["data"][0]["modalities"]["vision"] is False
    assert page.locator("#attach").is_hidden()
    page.evaluate(
        """() => {
          const transfer = new DataTransfer();
          transfer.items.add(new File([new Uint8Array([137, 80, 78, 71])], "x.png", { type: "image/png" }));
          document.getElementById("chat-input").dispatchEvent(
            new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
        }"""
    )
    assert page.locator("#attachments img").count() == 0


def test_same_prefix_is_cached_and_shows_its_divergence(page: sync_api.Page, server: str) -> None:
    page.goto(server + "/#chat")
    send_chat(page, "Name a large river in Africa.")
    message = send_chat(page, "Name a large river in Asia.")
    cached = int(message.locator(".usage").get_attribute("data-cached") or 0)
    assert cached > 0
    shoot(page, "console-chat")
    page.goto(server + "/#cache")
    row = page.locator("#recent tbody tr").first  # newest first
    sync_api.expect(row).to_have_attribute("data-source", "ram", timeout=10_000)
    divergence = row.locator(".div-text")
    sync_api.expect(divergence).to_contain_text("Asia")
    assert "Africa" in divergence.inner_text()  # what the earlier prompt had there
    assert "token " in divergence.inner_text()
    sync_api.expect(page.locator("#pool")).to_contain_text("blocks in use")
    sync_api.expect(page.locator("#disk")).to_contain_text("checkpoints")
    assert page.locator("#hit-chart path.line").count() == 1
    sync_api.expect(page.locator("#ckpt-count")).to_contain_text("by score")
    shoot(page, "console-cache")


def test_dashboard_updates_without_reload(page: sync_api.Page, server: str) -> None:
    page.goto(server + "/#cache")
    sync_api.expect(page.locator("#recent tbody tr").first).to_be_visible(timeout=10_000)
    seq_before = int(page.locator("#recent tbody tr td").first.inner_text())
    page.evaluate("window.kvserveMarker = 1")  # gone if the page reloads
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
    }
    response = httpx.post(f"{server}/v1/chat/completions", json=body, headers={"x-api-key": KEY}, timeout=120)
    assert response.status_code == 200
    first_cell = page.locator("#recent tbody tr").first.locator("td").first
    sync_api.expect(first_cell).to_have_text(str(seq_before + 1), timeout=10_000)
    assert page.evaluate("window.kvserveMarker") == 1
    # Sorting the checkpoints re-asks the server, still without a reload.
    page.click("#checkpoints th[data-sort=tokens]")
    sync_api.expect(page.locator("#ckpt-count")).to_contain_text("by tokens asc")
