"""The console's chat page in headless Chromium over a FakeEngine (no model): reasoning folded, a
tool call rendered, usage shown; a bad tools setting is reported, not sent. Skips without Chromium
or Playwright."""

from __future__ import annotations

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
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.browser import browser_page, require_browser
from tests.live_uvicorn import serve_in_thread

sync_api = require_browser()

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OUTPUT = f"<think>Paris needs a lookup.</think>Let me check.\n{CALL}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def service() -> ChatService:
    engine = FakeEngine(reply(OUTPUT), token_delay_s=0.002)
    syntax = OutputSyntax("hermes", REASONING["think"])
    return ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake-model", max_model_len=4096, segmenter_factory=syntax.segmenter),
    )


@pytest.fixture(scope="module")
def page(service: ChatService) -> Iterator[Any]:
    app = create_app(service, ApiSettings(served_model_name="fake-model"))
    with serve_in_thread(app) as (url, _), browser_page(sync_api) as page:
        page.goto(f"{url}/#chat")
        sync_api.expect(page.locator("#model-name")).to_contain_text("fake-model")
        yield page


def test_reasoning_is_folded_and_tool_calls_rendered(page: Any) -> None:
    page.fill("#set-tools", json.dumps(TOOLS))
    page.fill("#chat-input", "Weather in Paris?")
    page.click("#send")
    message = page.locator(".msg.assistant").last
    sync_api.expect(message.locator(".usage")).to_contain_text("generated ")
    details = message.locator("details")
    assert details.get_attribute("open") is None  # folded
    assert details.inner_text().strip() == "reasoning"
    assert details.locator("div").text_content() == "Paris needs a lookup."
    assert message.locator(".content").inner_text().strip() == "Let me check."
    assert message.locator(".tool-call").inner_text() == 'tool call get_weather({"city":"Paris"})'
    assert "tool_calls" in message.locator(".usage").inner_text()


def test_a_tool_call_is_answered_with_a_tool_message(page: Any, service: ChatService) -> None:
    """Follows the test above: the next send is the call's result, and the model goes on."""
    assert "get_weather" in page.locator("#chat-input").get_attribute("placeholder")
    page.fill("#chat-input", "18 degrees and sunny")
    page.click("#send")
    sync_api.expect(page.locator(".msg.tool")).to_have_text("get_weather → 18 degrees and sunny")
    sync_api.expect(page.locator(".msg.assistant").nth(1).locator(".usage")).to_be_visible()
    prompt_ids, _ = service.engine.requests[-1]  # type: ignore[attr-defined]
    prompt = service.detokenize(prompt_ids)
    assert "18 degrees and sunny" in prompt and prompt.index("get_weather") < prompt.index("18 degrees")


def test_bad_tools_json_is_reported_and_not_sent(page: Any) -> None:
    page.click("#clear")
    page.fill("#set-tools", "[{not json")
    page.fill("#chat-input", "hello")
    page.click("#send")
    sync_api.expect(page.locator("#settings-error")).to_contain_text("tools:")
    assert page.locator(".msg").count() == 0
