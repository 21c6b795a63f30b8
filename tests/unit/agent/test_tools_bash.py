"""bash / bash_status / bash_stop: foreground runs, background jobs across turns, stop deadlines,
interrupts, confirmation."""

from __future__ import annotations

import re
import threading
import time

from tests.unit.agent.conftest import Box


def test_bash_runs_in_the_working_directory(box) -> None:
    (box.root / "marker").touch()
    out = box.ok("bash", command="pwd; ls; echo err >&2; exit 3")
    assert "exit code 3" in out and str(box.root) in out and "marker" in out and "err" in out
    assert box.questions == ["allow bash pwd; ls; echo err >&2; exit 3?"]


def test_a_long_command_becomes_a_background_job_that_outlives_the_turn(box) -> None:
    out = box.ok("bash", command="echo started; sleep 1.5; echo done", wait_sec=1)
    assert "job 1 running" in out and "started" in out and "bash_status" in out
    out = box.ok("bash_status", job=1)
    assert "running" in out and "(no new output)" in out
    out = box.ok("bash_status", job=1, wait_sec=5)
    assert out.splitlines()[0].startswith("job 1 finished, exit code 0")
    assert out.splitlines()[1:] == ["done"]  # only what the model has not seen yet


def test_bash_stop_uses_term_then_kill_after_the_grace_period(box) -> None:
    box.ok("bash", command="trap '' TERM; echo stubborn; sleep 30", wait_sec=1)
    started = time.monotonic()
    out = box.ok("bash_stop", job=1, grace_sec=1)
    assert "killed with SIGKILL" in out and "killed by signal 9" in out
    assert time.monotonic() - started < 5
    box.ok("bash", command="sleep 30", wait_sec=1)
    out = box.ok("bash_stop", job=2, grace_sec=5)
    assert "stopped with SIGTERM" in out and "killed by signal 15" in out
    assert "already finished" in box.ok("bash_stop", job=2)


def test_stop_reaches_the_whole_process_group(box) -> None:
    out = box.ok("bash", command="sleep 60 & echo child=$!; wait", wait_sec=1)
    child = int(re.search(r"child=(\d+)", out).group(1))
    box.ok("bash_stop", job=1, grace_sec=2)
    time.sleep(0.2)
    assert not _alive(child)


def test_deadline_kills_a_job(box) -> None:
    out = box.ok("bash", command="sleep 30", wait_sec=1, timeout_sec=2)
    assert "running" in out
    out = box.ok("bash_status", job=1, wait_sec=10)
    assert "finished" in out and "deadline reached" in out


def test_unknown_job_and_denial(tmp_path) -> None:
    box = Box(tmp_path, answer=False)
    assert "no job 7" in box.error("bash_status", job=7)
    outcome = box("bash", command="touch x")
    assert outcome.was_denied and not (tmp_path / "x").exists()


def test_interrupt_stops_the_foreground_command(box) -> None:
    threading.Timer(0.5, box.ctx.cancel.set).start()
    started = time.monotonic()
    out = box.ok("bash", command="sleep 30", wait_sec=60)
    assert time.monotonic() - started < 5
    assert "interrupted by the user" in out


def test_large_output_is_elided_in_the_middle(box) -> None:
    out = box.ok("bash", command="seq 1 100000")
    assert out.count("\n") < 5000 and "bytes omitted" in out and "100000" in out and "\n1\n" in out


def test_close_stops_background_jobs(tmp_path) -> None:
    box = Box(tmp_path)
    out = box.ok("bash", command="sleep 60 & echo child=$!; wait", wait_sec=1)
    child = int(re.search(r"child=(\d+)", out).group(1))
    box.toolbox.close()
    time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
