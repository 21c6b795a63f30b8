"""Crash harness for the disk KV tier (issue 37): `kill -9` a real `kvserve serve` at random points of
its checkpoint writes and evictions, restart it on the same directory, and check what survived.

Each round is one server life on the same --kv-cache-dir (the default model, SmolLM2):

1. `kvserve kv verify` on the directory the last life left: temp files and orphan chunks are allowed
   (a write or delete the kill cut short, which the next start repairs), a corrupt or incompatible
   entry never is.
2. `kvserve serve` starts (it repairs the directory), and `kvserve kv verify` must then be clean.
3. Every checkpoint an earlier life reported stored (its log's `kvstore: stored ... checkpoint ID`,
   written once manifest and index are durable) is still there (`kvserve kv ls --json`), unless a
   log line said it was evicted or superseded before the kill.
   Even lives read the latest checkpoints into RAM at start-up (preload), odd ones do not, so
   their first turns load stored chunks themselves.
4. One or two turns of multi-turn conversations, each turn asking for an `agent_session`
   checkpoint (prompt + reply) as `kvserve agent` does; a conversation's first turn also writes a
   `cold` one. A small disk budget makes every save evict older checkpoints. The first turn of a conversation
   served from stored KV after a restart must answer (greedy) exactly as a server without the disk
   tier does.
5. `kill -9`, either mid-request or in the window after a response where its checkpoint is written
   and older ones are evicted; KVSERVE_KV_WRITE_DELAY_MS widens each step of those writes and
   deletes so the kill lands between them often.

Assistant turns are fixed text (not the model's replies), so every token of a conversation's prompt
is prefilled KV, which a cold server computes alike. The report (JSON with --json) counts rounds,
kills by window, kills that cut a write or delete short (orphans found at step 1), loads checked
against the cold server, and every failure; the exit status is 1 when there is any.

    .venv/bin/python scripts/crash_harness.py --rounds 100 --json crash.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Dense decode (--weight-quant none): no int4 copy of the weights to make at each of the hundred
# starts (~30 s of CPU each); the cold reference uses the same flags. A disk budget of a few
# checkpoints, so each save evicts. (The small RAM pool, ~4,300 tokens, would make reused blocks
# write `evict` checkpoints in longer lives; one or two turns a life seldom fill it.)
SERVE_ARGS = [
    *("--ctx", "2048", "--weight-quant", "none", "--max-num-seqs", "4"),
    *("--kv-cache-memory-mb", "96", "--kv-cache-budget-mb", "40"),
]
MAX_TOKENS = 8
MAX_CONVERSATION_CHARS = 5200  # ~1,600 tokens of SmolLM2's: a turn more still fits --ctx 2048
# One line of words, not a list literal: ruff's SIM905 prefers a list, which would be 35 lines.
WORDS = (  # noqa: SIM905
    "river stone garden window market lantern engine harbor forest signal paper orbit copper winter "
    "meadow bridge candle rocket thunder velvet pencil castle marble planet silver ladder island ribbon "
    "compass violin desert canyon glacier falcon mirror"
).split()

STORED = re.compile(r"kvstore: stored (\w+) checkpoint ([0-9a-f]{40})")
DELETED = re.compile(r"kvstore: (evicting|deleting) checkpoint ([0-9a-f]{40})")
CORRUPT = re.compile(r"kvstore: removing checkpoint ([0-9a-f]{40}): (.*)")
FROM_DISK = re.compile(r"request (\S+): (\d+) prompt tokens: \d+ from RAM, (\d+) from disk checkpoint")


@dataclass
class Ledger:
    """What the servers' logs reported: checkpoints stored and not since deleted, in log order."""

    live: dict[str, str] = field(default_factory=dict)  # checkpoint id -> reason
    stored_by_reason: dict[str, int] = field(default_factory=dict)
    num_evicted: int = 0  # over the disk budget
    num_superseded: int = 0  # an agent session's previous turn
    num_disk_loads: int = 0
    corrupt: list[str] = field(default_factory=list)  # "id: why" of every corrupt entry a server met
    offsets: dict[Path, int] = field(default_factory=dict)  # how far each log has been read

    def read_log(self, log: Path) -> None:
        """The lines `log` gained since the last call (whole lines only)."""
        with log.open("rb") as f:
            f.seek(self.offsets.get(log, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offsets[log] = self.offsets.get(log, 0) + end
        self.read(data[:end].decode(errors="replace"))

    def read(self, log_text: str) -> None:
        for line in log_text.splitlines():
            if stored := STORED.search(line):
                reason = stored.group(1)
                self.live[stored.group(2)] = reason
                self.stored_by_reason[reason] = self.stored_by_reason.get(reason, 0) + 1
            elif deleted := DELETED.search(line):
                self.live.pop(deleted.group(2), None)
                if deleted.group(1) == "evicting":
                    self.num_evicted += 1
                else:
                    self.num_superseded += 1
            elif corrupt := CORRUPT.search(line):
                self.corrupt.append(f"{corrupt.group(1)}: {corrupt.group(2)}")
                self.live.pop(corrupt.group(1), None)
            elif FROM_DISK.search(line):
                self.num_disk_loads += 1


@dataclass
class Conversation:
    """A multi-turn chat with a long system prompt of its own (the cold checkpoint's prefix)."""

    name: str
    system: str
    turns: list[tuple[str, str]] = field(default_factory=list)  # (user, fixed assistant text)
    rounds_served: set[int] = field(default_factory=set)

    def messages(self, question: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system}]
        for user, assistant in self.turns:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return [*messages, {"role": "user", "content": question}]

    def num_chars(self) -> int:
        return len(self.system) + sum(len(u) + len(a) for u, a in self.turns)


@dataclass
class Report:
    rounds: int = 0
    kills_mid_request: int = 0
    kills_after_response: int = 0
    kills_cutting_a_write: int = 0  # the directory held temp files or orphan chunks after the kill
    turns_completed: int = 0
    loads_checked: int = 0  # answers from stored KV compared with the cold server's
    checkpoints_stored: dict[str, int] = field(default_factory=dict)  # by reason
    checkpoints_evicted: int = 0
    checkpoints_superseded: int = 0
    disk_loads_logged: int = 0
    max_checkpoints_on_disk: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    cache: Path, log: Path, delay_ms: float, preload: bool
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "kvserve", "serve", "--port", str(port), "--kv-cache-dir", str(cache)]
    if not preload:  # then the first turns load their prefix from disk themselves
        command.append("--no-kv-cache-preload")
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVSERVE_KV_WRITE_DELAY_MS": str(delay_ms)}
    with log.open("ab") as out:
        process = subprocess.Popen([*command, *SERVE_ARGS], cwd=REPO, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900  # a shared, loaded machine can take minutes
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not start:\n{log.read_text(errors='replace')[-3000:]}")


def kv_command(*args: str) -> tuple[int, str]:
    """`kvserve kv ARGS` run in this process (the same entry point as the command, without another
    interpreter's start): (exit status, stdout)."""
    from kvserve.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["kv", *args])
            status = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
    return status, out.getvalue()


def chat(url: str, conversation: Conversation, question: str, *, save: bool = True) -> dict:
    body: dict = {
        "model": "smollm2",
        "messages": conversation.messages(question),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    if save:
        body["kvserve"] = {"checkpoint": "agent_session", "session_id": conversation.name}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()


class Harness:
    def __init__(self, work: Path, seed: int, delay_ms: float, reference_url: str) -> None:
        self.work = work
        self.cache = work / "kv"
        self.rng = random.Random(seed)
        self.delay_ms = delay_ms
        self.reference_url = reference_url
        self.ledger = Ledger()
        self.report = Report()
        self.conversations: list[Conversation] = []
        self.num_made = 0
        self.turn_seconds = [3.0]

    def conversation(self) -> Conversation:
        """A conversation to continue (mostly one with history, so stored KV gets loaded), retiring
        those about to outgrow the context."""
        self.conversations = [c for c in self.conversations if c.num_chars() < MAX_CONVERSATION_CHARS]
        if len(self.conversations) < 2 or self.rng.random() < 0.15:
            self.num_made += 1
            self.conversations.append(Conversation(f"conv-{self.num_made}", words(self.rng, 480) + "."))
        return self.rng.choice(self.conversations)

    def turn(self, url: str, round_: int, conversation: Conversation) -> None:
        """One completed turn; a conversation's first turn in this life that came from stored KV is
        checked against the cold server."""
        question = (
            f"In one word: which word comes first in note {len(conversation.turns)}? {words(self.rng, 25)}"
        )
        started = time.monotonic()
        document = chat(url, conversation, question)
        self.turn_seconds = [*self.turn_seconds[-9:], time.monotonic() - started]
        cached = document["usage"]["prompt_tokens_details"]["cached_tokens"]
        if round_ not in conversation.rounds_served and conversation.turns and cached:
            reference = chat(self.reference_url, conversation, question, save=False)
            answer = document["choices"][0]["message"]["content"]
            expected = reference["choices"][0]["message"]["content"]
            self.report.loads_checked += 1
            if answer != expected:
                self.fail(
                    round_, f"{conversation.name}: {cached} cached tokens gave {answer!r}, cold {expected!r}"
                )
        conversation.rounds_served.add(round_)
        conversation.turns.append((question, f"Noted: {words(self.rng, 30)}."))
        self.report.turns_completed += 1

    def fail(self, round_: int, what: str) -> None:
        self.report.failures.append(f"round {round_}: {what}")
        print(f"FAIL round {round_}: {what}", flush=True)

    def check_before_start(self, round_: int) -> None:
        if not self.cache.exists():
            return
        status, out = kv_command("verify", "--kv-cache-dir", str(self.cache))
        if "corrupt" in out or "incompatible" in out:
            self.fail(round_, f"after the kill, kv verify found:\n{out}")
        elif status != 0 and "orphan" in out:
            self.report.kills_cutting_a_write += round_ > 0

    def check_after_start(self, round_: int) -> None:
        status, out = kv_command("verify", "--kv-cache-dir", str(self.cache))
        if status != 0 or "no problems found" not in out:
            self.fail(round_, f"after the restart, kv verify is not clean:\n{out}")
        status, out = kv_command("ls", "--json", "--kv-cache-dir", str(self.cache))
        on_disk = {c["id"] for c in json.loads(out)["checkpoints"]} if status == 0 else set()
        self.report.max_checkpoints_on_disk = max(self.report.max_checkpoints_on_disk, len(on_disk))
        lost = sorted(set(self.ledger.live) - on_disk)
        if lost:
            self.fail(
                round_,
                f"checkpoints reported stored are gone: {[(i[:12], self.ledger.live[i]) for i in lost]}",
            )
            for checkpoint_id in lost:  # reported once
                self.ledger.live.pop(checkpoint_id)

    def run_round(self, round_: int) -> None:
        self.check_before_start(round_)
        log = self.work / f"server-{round_:03d}.log"
        try:
            process, url = start_server(self.cache, log, self.delay_ms, preload=round_ % 2 == 0)
        except RuntimeError as error:  # a directory a server cannot open is a failure; go on
            self.fail(round_, str(error))
            return
        try:
            self.ledger.read_log(log)  # the start's repairs and evictions
            self.check_after_start(round_)
            for _ in range(self.rng.randint(0, 1)):
                self.turn(url, round_, self.conversation())
            self.last_turn_and_kill(url, round_, process)
        finally:
            process.kill()
            process.wait()
        self.ledger.read_log(log)

    def last_turn_and_kill(self, url: str, round_: int, process: subprocess.Popen[bytes]) -> None:
        """A turn on a thread, and kill -9 at a random point: mid-request, or up to ~1.5 s after its
        response, while its checkpoints are written and older ones evicted."""
        conversation = self.conversation()
        done = threading.Event()

        def run() -> None:
            with contextlib.suppress(httpx.HTTPError):  # a kill mid-request: expected
                self.turn(url, round_, conversation)
            done.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        if self.rng.random() < 0.5:
            time.sleep(self.rng.uniform(0, max(self.turn_seconds)))
            self.report.kills_mid_request += not done.is_set()
            self.report.kills_after_response += done.is_set()
        else:
            done.wait(600)
            time.sleep(self.rng.uniform(0, 1.5))
            self.report.kills_after_response += 1
        process.send_signal(signal.SIGKILL)
        thread.join(60)

    def run(self, num_rounds: int, report_path: Path | None = None) -> Report:
        """`num_rounds` lives; the report so far is rewritten to `report_path` after each one (a run
        stopped early still leaves its figures)."""
        started = time.monotonic()
        for round_ in range(num_rounds):
            self.run_round(round_)
            self.report.rounds = round_ + 1
            print(
                f"round {round_ + 1}/{num_rounds}: {len(self.ledger.live)} checkpoints reported live, "
                f"{self.report.loads_checked} loads checked, {len(self.report.failures)} failures",
                flush=True,
            )
            if report_path is not None:
                report_path.write_text(json.dumps(asdict(self.summary(started)), indent=2) + "\n")
        self.check_before_start(num_rounds)
        return self.summary(started)

    def summary(self, started: float) -> Report:
        ledger = self.ledger
        return replace(
            self.report,
            checkpoints_stored=dict(ledger.stored_by_reason),
            checkpoints_evicted=ledger.num_evicted,
            checkpoints_superseded=ledger.num_superseded,
            disk_loads_logged=ledger.num_disk_loads,
            failures=[*self.report.failures, *(f"a server met a corrupt entry: {c}" for c in ledger.corrupt)],
            seconds=round(time.monotonic() - started, 1),
        )


@contextlib.contextmanager
def reference_server() -> Iterator[str]:
    """The same model and flags without the disk tier, in this process: the cold answers."""
    from kvserve.cli.embedded import embedded_server
    from kvserve.cli.serve import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with embedded_server(parser.parse_args([*SERVE_ARGS, "--no-kv-cache"])) as url:
        yield url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100, help="server lives, each ended by kill -9")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--write-delay-ms", type=float, default=40.0, help="KVSERVE_KV_WRITE_DELAY_MS")
    parser.add_argument("--work-dir", type=Path, help="keep the cache and the server logs here")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="kvserve-crash-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        url = stack.enter_context(reference_server())
        report = Harness(work, args.seed, args.write_delay_ms, url).run(args.rounds, args.json)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
