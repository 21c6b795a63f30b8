"""The default model serves the first request of Claude Code 2.1.332 (~12.8K tokens) with `--ctx 32768`
(what `make serve` runs): past SmolLM2's trained 8,192 tokens, through YaRN. Codex's is in
test_client_fixtures_smollm2_codex.py: a file each, so the test workers prefill the two in parallel
(each is minutes of fp32 prefill on one core)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.client_fixtures import check_claude_code_stream, post_fixture, serve_model

pytestmark = [pytest.mark.model, pytest.mark.slow]

TRAINED_CONTEXT = 8192


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    with serve_model("smollm2", 32768) as url:
        yield url


def test_claude_code_first_request_past_the_trained_context(smollm2_url: str) -> None:
    start = time.monotonic()
    frames = post_fixture(
        smollm2_url, "/v1/messages?beta=true", "claude-code-2.1.332_messages.json", max_tokens=8
    )
    print(f"\nClaude Code 2.1.332 first request on SmolLM2 at 32K: {time.monotonic() - start:.1f} s")
    check_claude_code_stream(frames, min_prompt_tokens=TRAINED_CONTEXT)
