"""Crash test of the disk KV tier against the real server process (issue 5's must-show).

`kvserve serve` over a tiny random-weight model folder (restarts take seconds) serves chat
requests whose ~700-token system prompts are all different, so each one writes a `cold`
checkpoint in the background writer. The server is killed with SIGKILL at random points
(mid-request or just after a response, while that request's checkpoint is being written)
until 50 checkpoint writes have been started. Afterwards: the directory holds no corrupt
entry at all (atomic writes leave only temp files and unreferenced chunks, which a start
repairs), a restarted server serves stored prefixes from disk with the same greedy tokens
as a server without the disk tier, and `kvserve kv verify` passes.
"""

from __future__ import annotations

import random
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.models.deepseek import save_tiny_deepseek_model
from tests.serve_process import REPO, in_process_server, running_server, start_server

NUM_WRITES = 50
SERVE_ARGS = ["--ctx", "4096"]


def system_prompt(rng: random.Random) -> str:
    """~700 byte tokens (the tokenizer is byte level): above the 512-token `cold` minimum."""
    words = (
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) for _ in range(110)
    )
    return " ".join(words)[:700]


def chat(url: str, system: str, question: str, max_tokens: int) -> tuple[str, int]:
    """(greedy text, cached prompt tokens) of one Chat Completions request."""
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    document = reply.json()
    return document["choices"][0]["message"]["content"], document["usage"]["prompt_tokens_details"][
        "cached_tokens"
    ]


def kv_verify(cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvserve", "kv", "verify", "--kv-cache-dir", str(cache)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def serve_until_killed(model: Path, cache: Path, log: Path, rng: random.Random, num_writes: int) -> list[str]:
    """One server life: `num_writes` requests, the last one killed at a random point from its
    start to shortly after its response. Returns the system prompts whose request completed."""
    process, url = start_server(["--model", str(model), "--kv-cache-dir", str(cache), *SERVE_ARGS], log)
    completed = []
    last = threading.Thread(target=_ignore_errors, args=(chat, url, system_prompt(rng), "hi", 1))
    try:
        for _ in range(num_writes - 1):
            system = system_prompt(rng)
            chat(url, system, "hi", max_tokens=1)
            completed.append(system)
        last.start()
        time.sleep(rng.uniform(0.0, 0.15))  # a tiny-model request takes ~50-100 ms; its write follows
    finally:
        process.kill()
        process.wait()
    if last.ident is not None:
        last.join()
    return completed


def _ignore_errors(function, *args) -> None:
    try:
        function(*args)
    except httpx.HTTPError:  # the server was killed under it: expected
        pass


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_during_checkpoint_writes_never_loads_a_corrupt_entry(tmp_path: Path) -> None:
    model = save_tiny_deepseek_model(tmp_path / "model", seed=4)
    cache, log = tmp_path / "kv", tmp_path / "server.log"
    rng = random.Random(20261202)
    completed: list[str] = []
    num_started = num_kills = 0
    while num_started < NUM_WRITES:
        batch = min(rng.randint(11, 16), NUM_WRITES - num_started)
        completed += serve_until_killed(model, cache, log, rng, batch)
        num_started += batch
        num_kills += 1
    assert num_kills >= 4 and len(completed) == NUM_WRITES - num_kills

    # Before any repair: a killed write leaves temp files or unused chunks, never a bad entry.
    before = kv_verify(cache)
    assert "corrupt" not in before.stdout and "incompatible" not in before.stdout, before.stdout

    questions = [(system, f"question {i}") for i, system in enumerate(rng.sample(completed, 6))]
    with running_server(["--model", str(model), "--kv-cache-dir", str(cache), *SERVE_ARGS], log) as url:
        from_disk = [chat(url, system, question, max_tokens=8) for system, question in questions]
    with in_process_server(["--model", str(model), "--no-kv-cache", *SERVE_ARGS]) as url:
        reference = [chat(url, system, question, max_tokens=8)[0] for system, question in questions]
    assert [text for text, _ in from_disk] == reference
    # Completed requests' checkpoints survived their server's death (all but one or two killed writes).
    assert sum(cached >= 512 for _, cached in from_disk) >= 4, from_disk

    after = kv_verify(cache)
    assert after.returncode == 0 and "no problems found" in after.stdout, after.stdout + after.stderr
    assert not list(cache.rglob("*.tmp.*"))
