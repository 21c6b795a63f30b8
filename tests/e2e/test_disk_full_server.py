"""A full disk under a real `kvserve serve` (SmolLM2, issue 37): the KV directory on a small tmpfs that
fills up while requests come in. Every request is answered (streamed or not), the disk tier warns
once and skips its saves while the filesystem is full, and it saves again once space returns.

Needs root to mount the tmpfs; skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.filler_text import WORDS as FILLER_WORDS
from tests.filler_text import filler as filler_words
from tests.serve_process import start_server, stop_server

pytestmark = [pytest.mark.model, pytest.mark.slow]

MIB = 2**20
FS_MB = 32
# A ~600-token cold checkpoint (600 of these words) of SmolLM2 takes 13 MiB (float16 KV): with 16 MiB left one fits, a
# second does not; removing the filler then makes room for the next.
FREE_AT_START_MB = 16
WORDS = FILLER_WORDS[:12]  # the checkpoint sizes above are measured with these


@contextmanager
def small_filesystem(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` mounted at `path`; skips the test where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem for the KV directory needs root")
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def chat(url: str, system: str, question: str = "Say hi.", *, stream: bool = False) -> int:
    """The status of one greedy request (a streamed one must also end with [DONE])."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": stream,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        text = reply.read().decode()
    if stream and reply.status_code == 200:
        assert text.rstrip().endswith("data: [DONE]"), text[-500:]
    return reply.status_code


def wait_for_log(log: Path, pattern: str, count: int = 1, timeout_s: float = 300) -> None:
    """Wait until `pattern` occurs `count` times in the server's log (the writer works in the background)."""
    deadline = time.monotonic() + timeout_s
    while len(re.findall(pattern, log.read_text(errors="replace"))) < count:
        assert time.monotonic() < deadline, f"no {pattern!r} x{count} in the log:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if " WARNING " in line]


@pytest.mark.timeout(1200)
def test_a_full_disk_skips_saves_with_one_warning_and_saving_resumes(tmp_path: Path) -> None:
    rng = random.Random(37)
    systems = [filler_words(rng, 600, WORDS) for _ in range(5)]
    log = tmp_path / "server.log"
    with small_filesystem(tmp_path / "fs", FS_MB) as fs:
        cache = fs / "kv"
        # Dense decode: no int4 copy of the weights to make at start-up (4 tokens an answer here).
        args = ["--kv-cache-dir", str(cache), "--ctx", "2048", "--weight-quant", "none"]
        process, url = start_server(args, log, timeout_s=600)
        try:
            filler = fs / "filler"
            filler.write_bytes(bytes(free_bytes(fs) - FREE_AT_START_MB * MIB))
            assert chat(url, systems[0]) == 200
            wait_for_log(log, r"stored cold checkpoint")  # the first fits; the disk is now full

            before_full = len(log.read_text())
            statuses = [
                chat(url, systems[1]),
                chat(url, systems[2], stream=True),
                chat(url, systems[0], "And now?"),  # its prefix from RAM: serving is unaffected
                chat(url, systems[3]),
            ]
            assert statuses == [200] * 4
            wait_for_log(log, r"cold checkpoint \w+ skipped")

            filler.unlink()  # space returns
            assert chat(url, systems[4]) == 200
            wait_for_log(log, r"stored cold checkpoint", count=2)
            full_phase = log.read_text()[before_full:]
            # The three cold saves of the full disk were skipped, with one warning for them all.
            assert re.search(r"writes to .* succeed again \(3 skipped\)", full_phase), full_phase[-3000:]
            warned = warnings_in(full_phase)
            assert len(warned) == 1 and "No space left on device" in warned[0], warned
        except BaseException:
            process.kill()
            process.wait()
            raise
        stop_server(process, log)
        assert not [p for p in cache.rglob("*") if ".tmp." in p.name]  # nothing half-written stays
