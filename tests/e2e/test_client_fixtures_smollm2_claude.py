"""The default model serves the first request of Claude Code 2.1.332 (~12.8K tokens) with `--ctx 16384`
(what `make serve` runs): past SmolLM2's trained 8,192 tokens, through YaRN. Codex's is in
test_client_fixtures_smollm2_codex.py: a file each, so the test workers prefill the two in parallel
(each is minutes of fp32 prefill on one core)."""

from __future__ import annotations

import pytest

from tests.e2e.client_fixtures import check_claude_code_stream, post_fixture

pytestmark = [pytest.mark.model, pytest.mark.slow]

TRAINED_CONTEXT = 8192


def test_claude_code_first_request_past_the_trained_context(smollm2_16k_url: str) -> None:
    frames = post_fixture(
        smollm2_16k_url, "/v1/messages?beta=true", "claude-code-2.1.332_messages.json", max_tokens=8
    )
    check_claude_code_stream(frames, min_prompt_tokens=TRAINED_CONTEXT)
