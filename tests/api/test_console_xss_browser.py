"""The web console's attack surface in headless Chromium (issue 37): whatever a model says, the
page never runs it. A scripted FakeEngine answers with hostile text (HTML, a markdown link with a
`javascript:` URL, SVG, an iframe, attribute breakouts) in its reasoning, its text and its tool
call's arguments and name; the user's message and an attached image's file name carry it too, and
the cache tab shows the prompts' text in its divergence column. Each payload would record itself in
`window.__xss` (or open a dialog) if it ran.

Twice: under the console's content security policy (then no CSP violation may even be reported:
a blocked attempt means markup got into the page), and with the policy bypassed, to show that the
page itself renders all of it as text, not only that the policy stops it.

Skips without Chromium or Playwright.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.reasoning import SYNTAXES as REASONING
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.segmenter import OutputSyntax
from tests.api.fake_engine import ByteTokenizer, FakeEngine, FakeTokenizerInfo, reply
from tests.browser import browser_page, require_browser
from tests.live_uvicorn import serve_in_thread

sync_api = require_browser()

PAYLOADS = [
    "<img src=x onerror=\"window.__xss.push('img');alert('img')\">",
    "<script>window.__xss.push('script');alert('script')</script>",
    "[click me](javascript:window.__xss.push('markdown'))",
    '<a href="javascript:window.__xss.push(\'a\')" id="xss-link">link</a>',
    "<svg onload=\"window.__xss.push('svg')\"><script>window.__xss.push('svg-script')</script></svg>",
    "<iframe srcdoc=\"<script>parent.__xss.push('iframe')</script>\"></iframe>",
    "\"><img src=x onerror=window.__xss.push('attribute')>",
    "<math><mtext><table><mglyph><style><img src=x onerror=window.__xss.push('mxss')>",
    "javascript:window.__xss.push('url')",
]
# Tags the page itself builds for messages and the dashboard's rows; anything else came from text.
PAGE_TAGS = {"DIV", "SPAN", "DETAILS", "SUMMARY", "TR", "TD", "BUTTON", "IMG"}
INIT_SCRIPT = """
window.__xss = [];
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(e.violatedDirective));
"""
# A 1x1 PNG: attached under a hostile file name.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def model_output(case: int) -> str:
    """Reasoning, text and a tool call that all carry payload `case`; the call's name is one too."""
    payload = PAYLOADS[case]
    call = json.dumps({"name": payload, "arguments": {"city": payload}})
    return f"<think>{payload}</think>{payload}\n<tool_call>\n{call}\n</tool_call>"


def answer(prompt_ids: list[int]) -> list[int]:
    """The case named by the last `case N` in the prompt."""
    prompt = ByteTokenizer().decode(prompt_ids)
    case = int(prompt.rsplit("case ", 1)[1].split(":", 1)[0])
    return reply(model_output(case))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = FakeEngine(answer, token_delay_s=0.0005)
    syntax = OutputSyntax("hermes", REASONING["think"])
    settings = ChatServiceSettings(
        model_name="fake-model", max_model_len=8192, segmenter_factory=syntax.segmenter
    )
    service = ChatService(engine, FakeTokenizerInfo(), settings)
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake-model"))) as (url, _):
        yield url


@pytest.fixture(params=[False, True], ids=["csp", "csp-bypassed"])
def page(request: pytest.FixtureRequest, url: str) -> Iterator[Any]:
    with browser_page(sync_api, bypass_csp=request.param) as page:
        page.add_init_script(INIT_SCRIPT)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.dialogs = dialogs
        page.is_csp_enforced = not request.param
        page.goto(f"{url}/#chat")
        sync_api.expect(page.locator("#model-name")).to_contain_text("fake-model")
        yield page


def foreign_tags(page: Any, selector: str) -> list[str]:
    tags = page.eval_on_selector_all(f"{selector} *", "nodes => nodes.map((n) => n.tagName)")
    return sorted(set(tags) - PAGE_TAGS)


def assert_inert(page: Any) -> None:
    page.wait_for_timeout(300)  # an onerror/onload would have fired by now
    assert page.evaluate("window.__xss") == []
    assert page.dialogs == []
    if page.is_csp_enforced:
        assert page.evaluate("window.__violations") == []


def test_model_output_in_every_part_of_a_message_is_text(page: Any) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    page.fill("#set-tools", json.dumps(tools))
    page.fill("#set-max_tokens", "4000")  # byte tokens: the whole scripted answer
    for case, payload in enumerate(PAYLOADS):
        page.click("#clear")
        page.fill("#chat-input", f"case {case}: {payload}")
        page.click("#send")
        message = page.locator(".msg.assistant").last
        sync_api.expect(message.locator(".usage")).to_be_visible(timeout=60_000)
        assert message.locator(".content").text_content().strip() == payload
        assert message.locator("details div").text_content() == payload
        assert page.locator(".msg.user").last.text_content() == f"case {case}: {payload}"
        call = message.locator(".tool-call")
        if call.count():  # the parser may refuse a call named like this: then it is text
            assert payload in call.text_content()
        # The tool call's pending result shows the call in the input's placeholder (an attribute).
        assert foreign_tags(page, "#messages") == [], payload
        page.locator("#messages").click()  # a link, had one been made, would run on a click
        assert_inert(page)


def test_prompt_text_in_the_cache_dashboard_is_text(page: Any) -> None:
    """The divergence column quotes prompts: two requests sharing a hostile prefix."""
    page.click("#clear")
    page.fill("#set-max_tokens", "4000")
    for case in (0, 4):
        page.fill("#chat-input", f"case {case}: {''.join(PAYLOADS)}")
        page.click("#send")
        sync_api.expect(page.locator(".msg.assistant").last.locator(".usage")).to_be_visible(timeout=60_000)
    page.goto(page.url.split("#")[0] + "#cache")
    sync_api.expect(page.locator("#recent tbody tr").first).to_be_visible()
    sync_api.expect(page.locator("#recent .divergence").first).to_contain_text("<")
    assert foreign_tags(page, "#recent tbody") == [] and foreign_tags(page, "#inflight tbody") == []
    assert_inert(page)


def test_an_attached_image_named_like_markup_is_only_an_image(page: Any) -> None:
    """A vision model's attach control: the file's name is never shown, the preview is a data: URI."""
    page.evaluate("import('/console/chat.js').then((chat) => chat.setImageInput(true))")
    name = "\"><img src=x onerror=window.__xss.push('filename')>.png"
    page.set_input_files("#attach-input", files=[{"name": name, "mimeType": "image/png", "buffer": PIXEL}])
    sync_api.expect(page.locator("#attachments img")).to_have_count(1)
    assert page.locator("#attachments img").get_attribute("src").startswith("data:image/png;base64,")
    assert "onerror" not in page.locator("#attachments").inner_html()
    assert_inert(page)
