"""A first request of a real coding client (tests/fixtures/clients) served by Gemma 3 270M at its
trained 32K context (`--ctx 32768`): a complete, well-formed stream through Gemma's own chat
template. The long fixtures (Claude Code 2.1.332, ~12.8K tokens; Codex 0.171.0, ~9.1K) are served
by the default model in test_real_clients.py (live, or recorded where the clients cannot run): on
Gemma they cost ~4 minutes of CPU prefill for no path that test does not already take, so Gemma
gets the short one (Claude Code 2.1.197 `--bare`, tools and system rendered)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.client_fixtures import check_claude_code_stream, post_fixture, serve_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma_url() -> Iterator[str]:
    with serve_model("gemma3-270m", 32768) as url:
        yield url


def test_claude_code_bare_first_request(gemma_url: str) -> None:
    frames = post_fixture(
        gemma_url, "/v1/messages?beta=true", "claude-code-2.1.197-bare_messages.json", max_tokens=8
    )
    check_claude_code_stream(frames, min_prompt_tokens=1000)  # tools and system rendered
