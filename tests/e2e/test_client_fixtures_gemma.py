"""The first requests real Claude Code and Codex CLI versions send (tests/fixtures/clients), served
by a real engine with a 32K context (Gemma 3 270M, `--ctx 32768`, its trained context): each gets
a complete, well-formed stream. test_client_fixtures_smollm2.py serves them from the default model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.client_fixtures import check_claude_code_stream, check_codex_stream, post_fixture, serve_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma_url() -> Iterator[str]:
    with serve_model("gemma3-270m", 32768) as url:
        yield url


@pytest.mark.parametrize(
    "fixture", ["claude-code-2.1.332_messages.json", "claude-code-2.1.197-bare_messages.json"]
)
def test_claude_code_first_request(gemma_url: str, fixture: str) -> None:
    frames = post_fixture(gemma_url, "/v1/messages?beta=true", fixture, max_tokens=8)
    check_claude_code_stream(frames, min_prompt_tokens=1000)  # tools and system rendered


def test_codex_first_request(gemma_url: str) -> None:
    frames = post_fixture(gemma_url, "/v1/responses", "codex-0.171.0_responses.json", max_output_tokens=8)
    check_codex_stream(frames, min_prompt_tokens=1000)
