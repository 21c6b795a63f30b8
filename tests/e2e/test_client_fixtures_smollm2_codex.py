"""The default model serves the first request of Codex 0.171.0 (~9.1K tokens) with `--ctx 16384` (what
`make serve` runs): past SmolLM2's trained 8,192 tokens, through YaRN. Claude Code's is in
test_client_fixtures_smollm2_claude.py."""

from __future__ import annotations

import pytest

from tests.e2e.client_fixtures import check_codex_stream, post_fixture

pytestmark = [pytest.mark.model, pytest.mark.slow]

TRAINED_CONTEXT = 8192


def test_codex_first_request_past_the_trained_context(smollm2_16k_url: str) -> None:
    frames = post_fixture(
        smollm2_16k_url, "/v1/responses", "codex-0.171.0_responses.json", max_output_tokens=8
    )
    check_codex_stream(frames, min_prompt_tokens=TRAINED_CONTEXT)
