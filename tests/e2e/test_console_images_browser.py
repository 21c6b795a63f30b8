"""The web console's chat with image attachments, in a real headless Chromium (Playwright) against
`kvserve serve`'s own wiring on the tiny random-weight SmolVLM folder: a PNG attached with the file
picker is sent as an `image_url` part, kept in the history, and the second turn's prompt comes from
the prefix cache across it; pasted and dropped images queue as removable thumbnails; a truncated
PNG is the error bubble and the server keeps serving. (The text-only model's page, without the
attach control: test_console_browser.py.) Skips without Chromium or Playwright."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import browser_page, require_browser
from tests.e2e.tiny_vlm_server import BLOCK, photo, serve_tiny_vlm, tiny_vlm_folder
from tests.image_samples import b64

pytestmark = pytest.mark.model

sync_api = require_browser()

SYSTEM = "You describe pictures. " + " ".join(f"Rule {i}: name colour {i}." for i in range(30))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tiny_vlm_folder(tmp_path_factory.mktemp("tiny-smolvlm"))
    with serve_tiny_vlm(folder, tmp_path_factory.mktemp("data")) as url:
        yield url


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[sync_api.Page]:
    with browser_page(sync_api) as page:
        page.goto(f"{server}/#chat")
        sync_api.expect(page.locator("#model-name")).to_contain_text("ctx 2048")
        yield page


def _new_chat(page: sync_api.Page) -> None:
    page.click("#clear")
    page.fill("#set-system", SYSTEM)
    page.fill("#set-max_tokens", "4")
    page.fill("#set-temperature", "0")


def _ask(page: sync_api.Page, text: str) -> sync_api.Locator:
    """Send `text` (with what is attached); the assistant message once it has ended."""
    before = page.locator(".msg.assistant").count()
    page.fill("#chat-input", text)
    page.press("#chat-input", "Enter")
    message = page.locator(".msg.assistant").nth(before)
    sync_api.expect(message.locator(".usage, .content:has-text('[')")).to_be_visible(timeout=120_000)
    return message


def _usage(message: sync_api.Locator) -> tuple[int, int, int]:
    """(prompt, cached, generated) tokens from the usage line the console shows."""
    text = message.locator(".usage").inner_text()
    found = re.search(r"prompt (\d+) · cached (\d+) · generated (\d+)", text)
    assert found is not None, text
    return int(found[1]), int(found[2]), int(found[3])


def test_an_attached_image_is_sent_kept_in_the_history_and_cached(
    page: sync_api.Page, tmp_path: Path
) -> None:
    _new_chat(page)
    sync_api.expect(page.locator("#attach")).to_be_visible()
    shot = tmp_path / "shot.png"
    shot.write_bytes(photo(21))
    page.set_input_files("#attach-input", str(shot))
    pending = page.locator("#attachments img")
    sync_api.expect(pending).to_have_count(1)
    assert pending.get_attribute("src") == "data:image/png;base64," + b64(photo(21))
    first = _ask(page, "What is in this picture?")
    sync_api.expect(pending).to_have_count(0)  # sent: the pending area is empty again
    user = page.locator(".msg.user").last
    assert user.locator("img").count() == 1 and user.inner_text().startswith("What is in this picture?")
    prompt_1, cached_1, generated_1 = _usage(first)
    assert generated_1 > 0 and cached_1 < prompt_1
    second = _ask(page, "And what colour is it?")
    prompt_2, cached_2, _ = _usage(second)
    assert prompt_2 > prompt_1 + 4  # the history, its image included, was sent again
    assert cached_2 >= prompt_1 // BLOCK * BLOCK  # ... and served from the prefix cache
    assert cached_2 >= 0.8 * prompt_2


def test_pasted_and_dropped_images_queue_and_can_be_removed(page: sync_api.Page) -> None:
    _new_chat(page)
    data = list(photo(22))
    page.evaluate(
        """(bytes) => {
          const files = () => {
            const transfer = new DataTransfer();
            transfer.items.add(new File([new Uint8Array(bytes)], "shot.png", { type: "image/png" }));
            return transfer;
          };
          const input = document.getElementById("chat-input");
          input.dispatchEvent(new ClipboardEvent("paste", { clipboardData: files(), bubbles: true, cancelable: true }));
          input.dispatchEvent(new DragEvent("drop", { dataTransfer: files(), bubbles: true, cancelable: true }));
        }""",
        data,
    )
    thumbnails = page.locator("#attachments img")
    sync_api.expect(thumbnails).to_have_count(2)
    page.locator("#attachments button").first.click()
    sync_api.expect(thumbnails).to_have_count(1)
    page.click("#clear")
    sync_api.expect(thumbnails).to_have_count(0)


def test_a_truncated_png_is_the_error_bubble_and_the_server_keeps_serving(
    page: sync_api.Page, tmp_path: Path
) -> None:
    _new_chat(page)
    good = photo(23)
    bad = tmp_path / "broken.png"
    bad.write_bytes(good[: len(good) // 2])
    page.set_input_files("#attach-input", str(bad))
    failed = _ask(page, "What is this?")
    sync_api.expect(failed).to_have_class(re.compile(r"\berror\b"))
    assert "image" in failed.inner_text().lower()
    assert failed.locator(".usage").count() == 0
    # The failed turn left the history: the next one (with a good image) is answered.
    ok = tmp_path / "ok.png"
    ok.write_bytes(good)
    page.set_input_files("#attach-input", str(ok))
    answer = _ask(page, "And this one?")
    assert _usage(answer)[2] > 0
