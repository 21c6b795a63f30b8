"""The interactive `kvserve agent` in a real pseudo-terminal (pexpect), against a scripted model behind
the real kvserve app: banner, the prefill bar, streamed Markdown with the status bar, Ctrl+C during a
generation, a confirmed tool call, /quit, and the terminal settings as they were before it started."""

from __future__ import annotations

import os
import sys
import time

import pexpect
import pytest

from tests.unit.agent.scripted_server import scripted_server, tool_call

STTY = r"(\d+:[0-9a-f:]+)\r\n"  # `stty -g` output


@pytest.fixture
def work(tmp_path):
    (tmp_path / "work").mkdir()
    return tmp_path


def _spawn(url: str, work) -> pexpect.spawn:
    agent = (
        f"{sys.executable} -m kvserve agent --url {url} --cwd {work / 'work'} --data-dir {work / 'data'} "
        "--session pty"
    )
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm-256color"}
    # stty -g before and after: the agent must leave the terminal as it found it
    command = f"bash -c 'stty -g; {agent}; echo EXIT=$?; stty -g'"
    child = pexpect.spawn(command, encoding="utf-8", timeout=90, dimensions=(30, 120), env=env)
    child.logfile_read = open(work / "pty.log", "w")  # noqa: SIM115 (closed with the child)
    return child


def test_interactive_session_streams_interrupts_confirms_and_restores_the_terminal(work) -> None:
    replies = ["Hello **world**, " * 300, tool_call("bash", command="echo from-bash"), "All done."]
    with scripted_server(replies, token_delay_s=0.01, num_prefill_chunks=4, chunk_delay_s=0.3) as server:
        child = _spawn(server.url, work)
        try:
            child.expect(STTY)
            before = child.match.group(1)
            child.expect("kvserve agent · scripted · ctx 8192 · session pty")
            child.expect(">")
            child.send("say hello\r")
            # the server's prefill counts (kvserve's progress comments) as a bar with a speed
            child.expect(r"prefill \[[#-]{12}\] \d+% \d+/\d+ @ \d+ t/s")
            child.expect("world")  # streamed while the model is still generating
            child.expect(r"ctx \d+/8192 \| generation \d+ tokens \| [\d.]+ t/s \| cached \d+")
            time.sleep(0.5)
            child.sendintr()
            child.expect(r"\[interrupted\]")
            _wait(lambda: server.engine.aborted)  # the request was cancelled on the server
            child.expect(">")
            child.send("run it\r")
            child.expect(r"allow bash echo from-bash\? \[y/N\]")
            child.send("y\r")
            child.expect("from-bash")
            child.expect("All done")
            child.expect(r"cached [1-9]\d*")  # the second turn reused the first from the cache
            child.expect(">")
            child.send("/history 2\r")
            child.expect("assistant: All done.")
            child.send("/quit\r")
            child.expect("session saved: pty")
            child.expect(r"EXIT=(\d+)")
            assert child.match.group(1) == "0"
            child.expect(STTY)
            assert child.match.group(1) == before
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    assert (work / "data" / "agent" / "sessions" / "pty.json").exists()


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)
