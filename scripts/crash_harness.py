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

`--evictions` aims the kills at evictions instead: a RAM pool of one context and up to three plain
turns of distinct conversations a life, so each turn reuses the blocks of the one before and the disk
tier saves them first (`evict`), while those saves delete older checkpoints over the disk budget; the
kill follows the log line that starts the target (`kvstore: queued evict checkpoint`, `kvstore:
evicting checkpoint`) by a random part of its length, and each kill is classified by the save it cut
(the writer's queue, read from the log) and whether it left a deletion half done.

    .venv/bin/python scripts/crash_harness.py --rounds 100 --json crash.json
    .venv/bin/python scripts/crash_harness.py --evictions --rounds 100 --write-delay-ms 300 --json crash.json
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
import sqlite3
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
# starts (1-3 s each on the 2-core EPYC); the cold reference uses the same flags. A disk budget of a few
# checkpoints, so each save evicts. (The small RAM pool, ~4,300 tokens, would make reused blocks
# write `evict` checkpoints in longer lives; one or two turns a life seldom fill it.)
SERVE_ARGS = [
    *("--ctx", "2048", "--weight-quant", "none", "--max-num-seqs", "4"),
    *("--kv-cache-memory-mb", "96", "--kv-cache-budget-mb", "40"),
]
# --evictions: the RAM pool at its floor, one context (a 1 MiB ask is raised to 65 blocks, 1,040
# tokens, at --ctx 1024, which a conversation below MAX_CONVERSATION_CHARS fits), so a life's second
# conversation reuses the blocks of the first, which the disk tier saves first (`evict`); the same
# 40 MiB disk budget, so those saves evict older checkpoints too.
EVICTION_SERVE_ARGS = [
    *("--ctx", "1024", "--weight-quant", "none", "--max-num-seqs", "4"),
    *("--kv-cache-memory-mb", "1", "--kv-cache-budget-mb", "40"),
]
MAX_TURNS_PER_EVICTION_LIFE = 3
MAX_TOKENS = 8
MAX_CONVERSATION_CHARS = 5200  # ~850 tokens of SmolLM2's: a turn more still fits --ctx 1024
# One line of words, not a list literal: ruff's SIM905 prefers a list, which would be 35 lines.
WORDS = (  # noqa: SIM905
    "river stone garden window market lantern engine harbor forest signal paper orbit copper winter "
    "meadow bridge candle rocket thunder velvet pencil castle marble planet silver ladder island ribbon "
    "compass violin desert canyon glacier falcon mirror"
).split()

STORED = re.compile(r"kvstore: stored (\w+) checkpoint ([0-9a-f]{40})")
DELETED = re.compile(r"kvstore: (evicting|deleting) checkpoint ([0-9a-f]{40})")
CORRUPT = re.compile(r"kvstore: removing checkpoint ([0-9a-f]{40}): (.*)")
QUEUED = re.compile(r"kvstore: queued (\w+) checkpoint ([0-9a-f]{40}) \((\d+) tokens\)")
EVICTING = re.compile(r"kvstore: evicting checkpoint ([0-9a-f]{40})")
CHECKPOINT_ID = re.compile(r"\b[0-9a-f]{40}\b")
FROM_DISK = re.compile(r"request (\S+): (\d+) prompt tokens: \d+ from RAM, (\d+) from disk checkpoint")


@dataclass
class Ledger:
    """What the servers' logs reported: checkpoints stored and not since deleted, in log order."""

    live: dict[str, str] = field(default_factory=dict)  # checkpoint id -> reason
    stored_by_reason: dict[str, int] = field(default_factory=dict)
    queued_by_reason: dict[str, int] = field(default_factory=dict)  # saves the engine handed the writer
    num_evicted: int = 0  # over the disk budget
    num_superseded: int = 0  # an agent session's previous turn
    num_disk_loads: int = 0
    corrupt: list[str] = field(default_factory=list)  # "id: why" of every corrupt entry a server met
    offsets: dict[Path, int] = field(default_factory=dict)  # how far each log has been read
    # The current life's writer queue, read from the log: (id, reason) queued and without an outcome
    # line yet, oldest (the one being written) first; and the checkpoints its head save is evicting.
    pending: list[tuple[str, str]] = field(default_factory=list)
    deleting: list[str] = field(default_factory=list)

    def new_life(self) -> None:
        """A kill ends the writer with its queue: what was pending is simply never stored."""
        self.pending.clear()
        self.deleting.clear()

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
            self.read_queue(line)
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

    def read_queue(self, line: str) -> None:
        """The writer is one thread, first in first out: any later line naming a queued id (stored,
        not stored, dropped, failed) is its outcome, and that of every save queued before it."""
        if queued := QUEUED.search(line):
            reason = queued.group(1)
            self.pending.append((queued.group(2), reason))
            self.queued_by_reason[reason] = self.queued_by_reason.get(reason, 0) + 1
        elif (evicting := EVICTING.search(line)) and self.pending:
            self.deleting.append(evicting.group(1))
        else:
            ids = [i for i, _ in self.pending]
            named = [ids.index(i) for i in CHECKPOINT_ID.findall(line) if i in ids]
            if named:
                del self.pending[: max(named) + 1]
                self.deleting.clear()


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
    # Where each kill landed, from the log (the writer's queue) and the directory:
    kills_in_evict_save: int = 0  # an `evict` save (the RAM pool's) queued or being written
    kills_in_other_save: int = 0  # a cold / agent_session / continued save queued or being written
    kills_in_disk_eviction: int = 0  # a save had begun deleting checkpoints over the disk budget
    kills_cutting_a_deletion: int = 0  # of those: a victim's manifest gone, its index row still there
    kills_with_no_save_in_flight: int = 0
    eviction_targets: dict[str, int] = field(default_factory=dict)  # --evictions: aimed at -> kills
    turns_completed: int = 0
    loads_checked: int = 0  # answers from stored KV compared with the cold server's
    checkpoints_queued: dict[str, int] = field(default_factory=dict)  # by reason
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
    cache: Path, log: Path, delay_ms: float, preload: bool, serve_args: Sequence[str]
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "kvserve", "serve", "--port", str(port), "--kv-cache-dir", str(cache)]
    if not preload:  # then the first turns load their prefix from disk themselves
        command.append("--no-kv-cache-preload")
    # This checkout first, the caller's PYTHONPATH after it (packages installed outside the venv).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "KVSERVE_KV_WRITE_DELAY_MS": str(delay_ms)}
    with log.open("ab") as out:
        process = subprocess.Popen([*command, *serve_args], cwd=REPO, env=env, stdout=out, stderr=out)
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


class LogTail:
    """The whole lines a server's log gains, as they come (to aim a kill at a step it logs)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.offset = log.stat().st_size

    def new_lines(self) -> list[str]:
        with self.log.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()


def is_deletion_cut(cache: Path, checkpoint_id: str) -> bool:
    """Whether a kill left this checkpoint half deleted: its manifest gone (a delete's first step)
    while the index still lists it (its last steps: index row, then unused chunks)."""
    for index in cache.glob("*/index.sqlite"):
        if (index.parent / "checkpoints" / f"{checkpoint_id}.kvm").exists():
            continue
        with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro", uri=True)) as db:
            query = "SELECT 1 FROM checkpoints WHERE checkpoint_id = ?"
            if db.execute(query, (checkpoint_id,)).fetchone() is not None:
                return True
    return False


def aim_window(tail: LogTail, target: str, delay_s: float, done: threading.Event) -> float | None:
    """Wait for the log line that starts the target; the seconds it lasts at most, or None if the
    turns ended (and 1.5 s more passed) without it."""
    ended_at = None
    while ended_at is None or time.monotonic() < ended_at + 1.5:
        for line in tail.new_lines():
            queued = QUEUED.search(line)
            if target == "evict_save" and queued and queued.group(1) == "evict":
                return (int(queued.group(3)) / 256 + 2) * delay_s  # ~a pause per chunk, +manifest
            if target == "deletion" and EVICTING.search(line):
                return delay_s
        if ended_at is None and done.is_set():
            ended_at = time.monotonic()
        time.sleep(0.01)
    return None


class Harness:
    def __init__(
        self, work: Path, seed: int, delay_ms: float, reference_url: str, evictions: bool = False
    ) -> None:
        self.work = work
        self.cache = work / "kv"
        self.rng = random.Random(seed)
        self.delay_ms = delay_ms
        self.evictions = evictions
        self.last_checked_round = -1
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
        checked against the cold server (with --evictions, the first such turn of the life)."""
        question = (
            f"In one word: which word comes first in note {len(conversation.turns)}? {words(self.rng, 25)}"
        )
        started = time.monotonic()
        # --evictions: plain requests, as most clients send; a turn's own agent_session save would
        # store the same tokens its `evict` save later finds stored.
        document = chat(url, conversation, question, save=not self.evictions)
        self.turn_seconds = [*self.turn_seconds[-9:], time.monotonic() - started]
        cached = document["usage"]["prompt_tokens_details"]["cached_tokens"]
        # --evictions checks one a life (the cold server's prefill is a second turn's worth of CPU).
        is_checked = not self.evictions or self.last_checked_round != round_
        if round_ not in conversation.rounds_served and conversation.turns and cached and is_checked:
            self.last_checked_round = round_
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
        serve_args = EVICTION_SERVE_ARGS if self.evictions else SERVE_ARGS
        try:
            process, url = start_server(self.cache, log, self.delay_ms, round_ % 2 == 0, serve_args)
        except RuntimeError as error:  # a directory a server cannot open is a failure; go on
            self.fail(round_, str(error))
            return
        try:
            self.ledger.read_log(log)  # the start's repairs and evictions
            self.check_after_start(round_)
            if self.evictions:
                self.eviction_life(url, round_, process, log)
            else:
                for _ in range(self.rng.randint(0, 1)):
                    self.turn(url, round_, self.conversation())
                self.last_turn_and_kill(url, round_, process)
        finally:
            process.kill()
            process.wait()
        self.ledger.read_log(log)
        self.record_kill_site()

    def record_kill_site(self) -> None:
        """Which save the kill cut (the head of the writer's queue in the log), whether that save
        had begun deleting checkpoints over the budget, and whether a deletion is left half done."""
        report, ledger = self.report, self.ledger
        if not ledger.pending:
            report.kills_with_no_save_in_flight += 1
        else:
            report.kills_in_evict_save += ledger.pending[0][1] == "evict"
            report.kills_in_other_save += ledger.pending[0][1] != "evict"
            if ledger.deleting:
                report.kills_in_disk_eviction += 1
                report.kills_cutting_a_deletion += any(
                    is_deletion_cut(self.cache, i) for i in ledger.deleting
                )
        ledger.new_life()

    def conversations_for_life(self, num: int) -> list[Conversation]:
        """`num` distinct conversations (each one's first turn of the life is checked if it loads)."""
        self.conversations = [c for c in self.conversations if c.num_chars() < MAX_CONVERSATION_CHARS]
        picked: list[Conversation] = []
        for _ in range(num):
            fresh = [c for c in self.conversations if c not in picked]
            if not fresh or self.rng.random() < 0.15:
                self.num_made += 1
                fresh = [Conversation(f"conv-{self.num_made}", words(self.rng, 480) + ".")]
                self.conversations += fresh
            picked.append(self.rng.choice(fresh))
        return picked

    def eviction_life(self, url: str, round_: int, process: subprocess.Popen[bytes], log: Path) -> None:
        """--evictions: turns of distinct conversations on a thread (the small pool makes each reuse
        the blocks of earlier ones), and kill -9 aimed at a random point of whichever the round picks:
        an `evict` save (from its queued line to about its end: a pause per chunk and the manifest) or
        a disk-tier deletion (the pause between a victim's manifest and its chunks). After the last
        turn, +1.5 s, if none came."""
        target = self.rng.choice(("evict_save", "deletion"))
        tail = LogTail(log)
        done = threading.Event()

        def run() -> None:
            with contextlib.suppress(httpx.HTTPError):  # a kill mid-request: expected
                for conversation in self.conversations_for_life(MAX_TURNS_PER_EVICTION_LIFE):
                    self.turn(url, round_, conversation)
            done.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        window = aim_window(tail, target, self.delay_ms / 1000, done)
        hit = window is not None
        key = f"{target} {'aimed at' if hit else 'never came'}"
        self.report.eviction_targets[key] = self.report.eviction_targets.get(key, 0) + 1
        if window is not None:
            time.sleep(self.rng.uniform(0, window))
        process.send_signal(signal.SIGKILL)
        thread.join(60)

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
            checkpoints_queued=dict(ledger.queued_by_reason),
            checkpoints_stored=dict(ledger.stored_by_reason),
            checkpoints_evicted=ledger.num_evicted,
            checkpoints_superseded=ledger.num_superseded,
            disk_loads_logged=ledger.num_disk_loads,
            failures=[*self.report.failures, *(f"a server met a corrupt entry: {c}" for c in ledger.corrupt)],
            seconds=round(time.monotonic() - started, 1),
        )


@contextlib.contextmanager
def reference_server(serve_args: Sequence[str]) -> Iterator[str]:
    """The same model and flags without the disk tier, in this process: the cold answers."""
    from kvserve.cli.embedded import embedded_server
    from kvserve.cli.serve import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with embedded_server(parser.parse_args([*serve_args, "--no-kv-cache"])) as url:
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
    parser.add_argument(
        "--evictions",
        action="store_true",
        help="aim the kills at the RAM pool's `evict` saves and the disk tier's deletions (a pool at "
        "its floor, up to 4 plain turns a life)",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="kvserve-crash-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        # --evictions: the cold server keeps every conversation's prefix in a RAM pool of its own size
        # (prompt KV it computed itself, never loaded), so a check prefills only the new turn.
        reference_args = (
            [*EVICTION_SERVE_ARGS, "--kv-cache-memory-mb", "512"] if args.evictions else SERVE_ARGS
        )
        url = stack.enter_context(reference_server(reference_args))
        harness = Harness(work, args.seed, args.write_delay_ms, url, evictions=args.evictions)
        report = harness.run(args.rounds, args.json)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
