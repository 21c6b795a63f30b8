"""The TUI in a real pseudo-terminal against the kvserve app on a scripted FakeEngine: it shows the
cases, pauses on p, re-runs the selected case on Enter, and q quits with the report."""

from __future__ import annotations

import asyncio
import io
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.cli.embedded import serve_in_thread
from kvserve.eval.cases import CaseFilter, load_cases, select
from kvserve.eval.client import EvalClient
from kvserve.eval.grade import CaseStatus, ModelOutput
from kvserve.eval.keys import key_name
from kvserve.eval.result import CaseResult
from kvserve.eval.runner import EvalRunner, RunSettings
from kvserve.eval.tui import _handle, _View
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.serve_process import child_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def url() -> Iterator[str]:
    engine = FakeEngine(reply("Answer: 85"), token_delay_s=0.01)
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name="fake", max_model_len=4096)
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake"))) as (base, _):
        yield base


def test_key_names() -> None:
    assert [key_name(k) for k in ("\x1b[A", "\x1b[B", "\r", "p", "Q", "\x1b")] == [
        "up", "down", "enter", "p", "q", None,
    ]  # fmt: skip


def test_tui_runs_pauses_reruns_and_quits_with_the_report(url: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    child = pexpect.spawn(
        sys.executable,
        ["-m", "kvserve", "--log-level", "WARNING", "eval", "--url", url, "--suite", "smoke",
         "--domain", "arithmetic", "--domain", "science", "--trace", str(trace)],
        cwd=str(ROOT),
        env=child_env(TERM="xterm-256color"),
        dimensions=(30, 120),
        encoding="utf-8",
        timeout=180,  # the child imports torch: slow on a loaded 2-core machine
    )  # fmt: skip
    child.expect("cases \\(2\\)")
    child.expect("passed 1")  # one right (85), one wrong (85 is not a letter)
    child.expect("failed 1")
    child.send("p")
    child.expect("PAUSED")
    child.send("p")
    child.send("\x1b[B")  # select the second case and run it again
    child.send("\r")
    deadline = time.monotonic() + 30
    while trace.read_text().count('"type": "case"') < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    child.send("q")
    child.expect("suite smoke")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert trace.read_text().count('"type": "case"') == 3


def _default_sigint() -> None:
    """A child that inherits SIGINT ignored (a suite started in the background by a non-interactive
    shell) ignores the Ctrl-C, and asyncio.run installs no handler over SIG_IGN: the child then ran
    every case to the end. A terminal's Ctrl-C reaches a foreground `kvserve eval`; so must ours."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_plain_mode_still_reports(tmp_path: Path) -> None:
    engine = FakeEngine(reply("Answer: 85 " * 50), token_delay_s=0.2)  # slow: still running at Ctrl-C
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name="fake", max_model_len=4096)
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake"))) as (base, _):
        child = pexpect.spawn(
            sys.executable,
            ["-m", "kvserve", "--log-level", "WARNING", "eval", "--url", base, "--suite", "smoke", "--plain"],
            cwd=str(ROOT),
            env=child_env(),
            encoding="utf-8",
            timeout=180,  # the child imports torch: slow on a loaded 2-core machine
            preexec_fn=_default_sigint,
        )
        child.logfile_read = log = io.StringIO()
        # Interrupt only once a case is running (the test is about Ctrl-C during a run): a fixed 30 s
        # wait fired during start-up on a loaded 2-core machine once, and that Ctrl-C was lost.
        deadline = time.monotonic() + 170
        while not engine.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.running, "no case started"
        child.sendintr()
        child.expect("suite smoke")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 130
    assert "STOPPED" in log.getvalue() and "the run was stopped" in log.getvalue()


def test_the_output_pane_streams_the_running_case_and_arrows_move_the_selection() -> None:
    """The split view without a terminal: the newest running case's partial output is shown while
    following; Up/Down select (clamped at both ends) and the pane then shows the selected case."""
    cases = select(load_cases(), CaseFilter(("smoke",)))[:3]
    runner = EvalRunner(EvalClient("http://127.0.0.1:9"), cases, RunSettings())
    runner.runs[1].result = CaseResult(cases[1], CaseStatus.RUNNING)
    runner.runs[1].text = "Let me count the letters: t, e, n"
    runner.runs[2].result = CaseResult(cases[2], CaseStatus.FAILED, "A", output=ModelOutput("Answer: A"))
    view = _View(runner)

    def screen() -> str:
        console = Console(record=True, width=140, height=20, file=io.StringIO())
        console.print(view.render(20))
        return console.export_text()

    assert "Let me count the letters: t, e, n" in screen() and f"{cases[1].id} [RUNNING]" in screen()
    loop = asyncio.new_event_loop()
    try:
        for key in ("down", "down", "down", "up", "down"):
            _handle(key, view, loop)
        assert view.selected == 2 and not view.is_following
        assert "Answer: A" in screen() and "extracted: 'A'" in screen()
        for key in ("up", "up", "up"):
            _handle(key, view, loop)
        assert view.selected == 0 and f"{cases[0].id} [PENDING]" in screen()
    finally:
        loop.close()
