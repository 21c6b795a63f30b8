"""The timed yes/no prompt and the pre-approval policy."""

from __future__ import annotations

import io
import os
import threading
import time

from kvserve.agent.confirm import ConfirmPolicy, TimedPrompt


def _prompt(answer: bytes | None, timeout_s: float = 5.0, cancel: threading.Event | None = None):
    read_fd, write_fd = os.pipe()
    if answer is not None:
        os.write(write_fd, answer)
    out = io.StringIO()
    prompt = TimedPrompt(os.fdopen(read_fd), out, timeout_s, cancel)
    return prompt, out, write_fd


def test_yes_is_yes_and_anything_else_is_no() -> None:
    for answer, expected in (
        (b"y\n", True),
        (b"YES\n", True),
        (b"n\n", False),
        (b"sure\n", False),
        (b"\n", False),
    ):
        prompt, out, _ = _prompt(answer)
        assert prompt("allow bash ls?") is expected
        assert out.getvalue().startswith("allow bash ls? [y/N]")


def test_silence_denies_after_the_timeout() -> None:
    prompt, out, _ = _prompt(None, timeout_s=0.3)
    started = time.monotonic()
    assert prompt("allow?") is False
    assert 0.25 < time.monotonic() - started < 2
    assert "denied (no answer)" in out.getvalue()


def test_end_of_input_and_cancel_deny() -> None:
    prompt, _, write_fd = _prompt(None)
    os.close(write_fd)
    assert prompt("allow?") is False
    cancel = threading.Event()
    prompt, _, _ = _prompt(None, cancel=cancel)
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    assert prompt("allow?") is False and time.monotonic() - started < 2


def test_policy() -> None:
    assert ConfirmPolicy(is_yes_to_all=True).is_preapproved("bash")
    policy = ConfirmPolicy(allowed_tools=frozenset({"edit"}))
    assert policy.is_preapproved("edit") and not policy.is_preapproved("bash")
