"""Runs untrusted Python (a model's function plus its tests) in a limited subprocess.

Limits: wall-clock timeout (the whole process group is killed), CPU seconds, address space, file
size and no core files via `resource.setrlimit` (set first thing in the program); a fresh temporary directory as cwd; `python -I -S`
(no environment, user site or site-packages); and an audit hook installed before the code runs
that refuses sockets, subprocesses, forks, ctypes and writes outside the temporary directory.
NOTE: this stops accidents and careless code, not a determined attacker (no kernel isolation
such as namespaces or seccomp is available here); do not grade hostile output with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_GUARD = r"""
import os as _os, resource as _resource, sys as _sys
for _limit, _value in ((_resource.RLIMIT_CPU, {cpu_s}), (_resource.RLIMIT_AS, {memory_bytes}),
                       (_resource.RLIMIT_FSIZE, {file_bytes}), (_resource.RLIMIT_CORE, 0)):
    _resource.setrlimit(_limit, (_value, _value))
_ROOT = _os.path.realpath(_os.getcwd())
_BLOCKED = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn",
            "os.spawn", "os.kill", "os.killpg", "ctypes.", "pty.", "webbrowser.", "urllib.Request",
            "shutil.rmtree", "os.chdir", "os.chroot", "resource.setrlimit", "sys.addaudithook")
_WRITES = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
           "os.symlink", "os.link", "os.utime", "shutil.copyfile", "shutil.move")

def _inside(path):
    try:
        return _os.path.realpath(_os.fsdecode(path)).startswith(_ROOT + _os.sep)
    except (TypeError, ValueError):
        return False

def _audit(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) >= 3:
        path, mode, flags = args[0], args[1] or "", args[2] or 0
        writing = any(c in str(mode) for c in "wax+") or flags & (_os.O_WRONLY | _os.O_RDWR | _os.O_CREAT)
        if writing and not isinstance(path, int) and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed")
    elif event in _WRITES and args and not isinstance(args[0], int) and not _inside(args[0]):
        raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")

_sys.addaudithook(_audit)
del _audit
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20


@dataclass(frozen=True)
class SandboxResult:
    is_passed: bool
    detail: str  # "ok", "timeout", or the tail of stderr
    elapsed_s: float


DEFAULT_LIMITS = SandboxLimits()


def run_python(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """Runs `code` in a fresh interpreter; passed means it exited 0 within the limits."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvserve-eval-") as work_dir:
        program = Path(work_dir) / "program.py"
        program.write_text(_prelude(limits) + "\n" + code, encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(program)],
            cwd=work_dir,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills everything it started
        )
        try:
            _, stderr = process.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return SandboxResult(False, f"timeout after {limits.timeout_s:g}s", time.monotonic() - start)
    elapsed = time.monotonic() - start
    if process.returncode == 0:
        return SandboxResult(True, "ok", elapsed)
    return SandboxResult(False, _describe_failure(process.returncode, stderr), elapsed)


def _prelude(limits: SandboxLimits) -> str:
    """The guard, limits set by the program itself (a preexec_fn is unsafe when grading in threads)."""
    return (
        _GUARD.replace("{cpu_s}", str(int(limits.timeout_s) + 1))
        .replace("{memory_bytes}", str(limits.memory_bytes))
        .replace("{file_bytes}", str(limits.file_bytes))
    )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def _describe_failure(returncode: int, stderr: bytes) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else f"exit status {returncode}"
