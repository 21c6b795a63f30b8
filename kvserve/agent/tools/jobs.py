"""Shell jobs: each `bash` command runs in its own process group with output going to a file, so
a command that outlives the foreground wait keeps running as a background job across turns."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MAX_REPORT_BYTES = 16 << 10
POLL_S = 0.05


@dataclass
class Job:
    job_id: int
    command: str
    process: subprocess.Popen
    output_path: Path
    started: float = field(default_factory=time.monotonic)
    num_shown_bytes: int = 0  # output already reported to the model
    stop_note: str = ""  # why the agent stopped it (deadline, bash_stop, interrupt)
    timer: threading.Timer | None = None

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def new_output(self) -> str:
        """Output the model has not seen yet, middle elided past MAX_REPORT_BYTES."""
        with open(self.output_path, "rb") as f:
            f.seek(self.num_shown_bytes)
            data = f.read()
        self.num_shown_bytes += len(data)
        if len(data) > MAX_REPORT_BYTES:
            head, tail = data[: MAX_REPORT_BYTES // 4], data[-(MAX_REPORT_BYTES * 3 // 4) :]
            omitted = len(data) - len(head) - len(tail)
            data = head + f"\n[… {omitted} bytes omitted …]\n".encode() + tail
        return data.decode("utf-8", errors="replace")

    def status_line(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.is_running:
            return (
                f"job {self.job_id} running for {elapsed:.0f}s (pid {self.process.pid}): {self.command[:80]}"
            )
        code = self.process.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"job {self.job_id} finished, {how}{self.stop_note}: {self.command[:80]}"


class JobTable:
    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.jobs: dict[int, Job] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    def start(self, command: str, timeout_s: float) -> Job:
        fd, name = tempfile.mkstemp(prefix="kvserve_agent_job_", suffix=".log")
        env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"}
        with os.fdopen(fd, "wb") as out:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches its children too
                env=env,
            )
        with self._lock:
            job = Job(self._next_id, command, process, Path(name))
            self.jobs[job.job_id] = job
            self._next_id += 1
        job.timer = threading.Timer(timeout_s, self._deadline, (job,))
        job.timer.daemon = True
        job.timer.start()
        return job

    def get(self, job_id: int) -> Job | None:
        return self.jobs.get(job_id)

    def running(self) -> list[Job]:
        return [job for job in self.jobs.values() if job.is_running]

    @staticmethod
    def wait(job: Job, wait_s: float, cancel: threading.Event) -> bool:
        """Waits until the job ends, `wait_s` passes or `cancel` is set; True if it ended."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not cancel.is_set():
            try:
                job.process.wait(timeout=min(POLL_S, max(deadline - time.monotonic(), 0)))
                return True
            except subprocess.TimeoutExpired:
                continue
        return not job.is_running

    @staticmethod
    def stop(job: Job, grace_s: float, note: str) -> str:
        """SIGTERM to the job's process group, SIGKILL if it is still alive after `grace_s`."""
        if not job.is_running:
            return "already finished"
        job.stop_note = f" ({note})"
        _signal_group(job, signal.SIGTERM)
        try:
            job.process.wait(timeout=grace_s)
            return "stopped with SIGTERM"
        except subprocess.TimeoutExpired:
            _signal_group(job, signal.SIGKILL)
            job.process.wait()
            return f"still running {grace_s:g}s after SIGTERM; killed with SIGKILL"

    def _deadline(self, job: Job) -> None:
        self.stop(job, 5.0, "deadline reached")

    def close(self) -> None:
        """Stops every job (the agent is exiting) and removes their output files."""
        for job in list(self.jobs.values()):
            self.stop(job, 2.0, "agent exited")
            if job.timer is not None:
                job.timer.cancel()
            job.output_path.unlink(missing_ok=True)
        self.jobs.clear()


def _signal_group(job: Job, sig: signal.Signals) -> None:
    try:
        os.killpg(job.process.pid, sig)
    except ProcessLookupError:
        pass  # it exited between the check and the signal
