"""RequestRecorder: a bounded, thread-safe record of recent requests, for the web console.

Fed once per request from the one event pipeline (`ChatService.generate`: start and end),
never per token: a request in flight is read lazily from its live `GenerationRun` (prefill
progress, tokens so far) when someone asks. The engine's disk tier reports where a prompt's
cached prefix came from (`note_source`, from the engine thread). Finished requests go into a
ring buffer; their prompt tokens are kept (as int32 arrays, under a token budget) so the
console can show where a prompt diverged from the ones before it (`prompt_divergence.py`).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from kvserve.serving.generation_run import GenerationRun

Outcome = Literal["stop", "length", "aborted"]
Phase = Literal["queued", "prefill", "decode"]
SourceKind = Literal["cold", "ram", "disk"]
# An image of a prompt: the first token of its span and its content hash. Images render to the same
# placeholder tokens whatever their pixels, so where two prompts diverge needs these too.
PromptImageKey = tuple[int, str]


@dataclass(frozen=True, slots=True)
class PromptSource:
    """Where a prompt's cached prefix came from, as the engine's disk tier found it at admission."""

    num_ram_tokens: int
    num_disk_tokens: int
    checkpoint_id: str | None = None  # the disk checkpoint the tokens were loaded from


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request. `prompt_token_ids` is None once the token budget dropped it."""

    seq: int  # 1, 2, ... in order of finishing: the console's cursor
    request_id: str
    started: float  # wall clock (time.time())
    num_prompt_tokens: int
    num_cached_tokens: int  # RAM + disk hit, as the engine reported it
    num_disk_tokens: int
    checkpoint_id: str | None
    num_output_tokens: int
    ttft_s: float | None  # None when no token came (aborted during prefill)
    duration_s: float
    outcome: Outcome
    prompt_token_ids: array | None
    images: tuple[PromptImageKey, ...] = ()  # in prompt order

    @property
    def source(self) -> SourceKind:
        return source_kind(self.num_cached_tokens, self.num_disk_tokens)

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.duration_s - (self.ttft_s or 0.0)
        return (self.num_output_tokens - 1) / decode_s if self.num_output_tokens > 1 and decode_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LiveRequest:
    """A snapshot of one request in flight."""

    request_id: str
    started: float
    elapsed_s: float
    phase: Phase
    num_prompt_tokens: int
    num_computed_tokens: int  # prompt tokens in the KV cache so far (cached prefix included)
    num_cached_tokens: int
    num_disk_tokens: int
    num_output_tokens: int

    @property
    def source(self) -> SourceKind:
        return source_kind(self.num_cached_tokens, self.num_disk_tokens)


@dataclass(frozen=True, slots=True)
class HitRateBucket:
    """Requests that finished in [start, start + width): prompt tokens and how many were cached."""

    start: float
    num_requests: int
    num_prompt_tokens: int
    num_cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


def source_kind(num_cached_tokens: int, num_disk_tokens: int) -> SourceKind:
    return "disk" if num_disk_tokens else "ram" if num_cached_tokens else "cold"


@dataclass(slots=True)
class _Live:
    request_id: str
    prompt_token_ids: Sequence[int]
    run: GenerationRun
    started: float
    started_mono: float
    images: tuple[PromptImageKey, ...]
    source: PromptSource | None = None


class RequestRecorder:
    def __init__(
        self,
        max_records: int = 512,
        max_kept_tokens: int = 4_000_000,
        bucket_s: float = 10.0,
        max_buckets: int = 360,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """At most `max_records` finished requests, holding at most `max_kept_tokens` prompt tokens
        (16 MB by default; older records lose theirs first); hit-rate buckets of `bucket_s` seconds,
        the last `max_buckets` of them (an hour by default)."""
        self.max_kept_tokens = max_kept_tokens
        self.bucket_s = bucket_s
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._records: deque[RequestRecord] = deque(maxlen=max_records)
        self._buckets: deque[list[float]] = deque(maxlen=max_buckets)  # [start, requests, prompt, cached]
        self._kept: deque[tuple[int, int]] = deque()  # (seq, num tokens) of records that keep tokens
        self._num_kept_tokens = 0
        self._seq = 0
        # `serve --api-servers`: set in front ends 1..N-1, whose finished records also go to front
        # end 0's recorder (`adopt` there), the one the web console reads.
        self.forward: Callable[[RequestRecord], None] | None = None

    # -- writers (the event loop; note_source: the engine thread) ---------------------

    def start(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        run: GenerationRun,
        images: tuple[PromptImageKey, ...] = (),
    ) -> None:
        entry = _Live(request_id, prompt_token_ids, run, self._clock(), self._monotonic(), images)
        with self._lock:
            self._live[request_id] = entry

    def note_source(self, request_id: str, source: PromptSource) -> None:
        with self._lock:
            entry = self._live.get(request_id)
            if entry is not None:
                entry.source = source

    def end(self, request_id: str) -> None:
        """The request's stream is over (finished, stopped, aborted or failed)."""
        with self._lock:
            entry = self._live.pop(request_id, None)
        if entry is None:
            return
        run = entry.run
        num_cached = run.num_cached_tokens if run.prefill.is_done else run.prefill.num_cached_tokens
        num_disk = entry.source.num_disk_tokens if entry.source is not None else 0
        tokens = array("i", entry.prompt_token_ids)  # 4 bytes a token instead of a list's ~36
        record = self.adopt(
            RequestRecord(
                0,  # numbered by `adopt`
                request_id,
                entry.started,
                len(tokens),
                num_cached,
                min(num_disk, num_cached),
                entry.source.checkpoint_id if entry.source is not None and num_disk else None,
                run.num_output_tokens,
                run.prefill.elapsed_s,
                self._monotonic() - entry.started_mono,
                run.finish_reason or "aborted",
                tokens,
                entry.images,
            )
        )
        if self.forward is not None:
            self.forward(record)

    def adopt(self, record: RequestRecord) -> RequestRecord:
        """A finished request recorded here under this recorder's next sequence number (the
        console's cursor): this front end's own (`end`), or one another front end of this server
        finished. Returns it numbered."""
        with self._lock:
            self._seq += 1
            record = replace(record, seq=self._seq)
            self._append(record)
            self._count_hit(record)
        return record

    def _append(self, record: RequestRecord) -> None:
        if len(self._records) == self._records.maxlen:
            dropped = self._records[0]
            if self._kept and self._kept[0][0] == dropped.seq:
                self._num_kept_tokens -= self._kept.popleft()[1]
        self._records.append(record)
        self._kept.append((record.seq, record.num_prompt_tokens))
        self._num_kept_tokens += record.num_prompt_tokens
        while self._num_kept_tokens > self.max_kept_tokens and len(self._kept) > 1:
            seq, num_tokens = self._kept.popleft()
            self._num_kept_tokens -= num_tokens
            self._drop_tokens(seq)

    def _drop_tokens(self, seq: int) -> None:
        index = seq - self._records[0].seq
        if 0 <= index < len(self._records):
            old = self._records[index]
            self._records[index] = replace(old, prompt_token_ids=None)

    def _count_hit(self, record: RequestRecord) -> None:
        now = self._clock()
        start = now - now % self.bucket_s
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0, 0, 0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        bucket[2] += record.num_prompt_tokens
        bucket[3] += record.num_cached_tokens

    # -- readers ----------------------------------------------------------------------

    def live(self) -> list[LiveRequest]:
        """Requests in flight, oldest first. Reads each run's counters: call it on the event loop."""
        now = self._monotonic()
        with self._lock:
            entries = list(self._live.values())
        return [_snapshot(entry, now) for entry in entries]

    def recent(self, after_seq: int = 0, limit: int | None = None) -> list[RequestRecord]:
        """Finished requests with seq > `after_seq`, oldest first; with `limit`, the newest `limit`."""
        with self._lock:
            if not self._records or after_seq >= self._records[-1].seq:
                return []
            first = max(0, after_seq + 1 - self._records[0].seq)
            records = [self._records[i] for i in range(first, len(self._records))]
        return records[-limit:] if limit is not None else records

    def get(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            return next((r for r in reversed(self._records) if r.request_id == request_id), None)

    def before(self, record: RequestRecord, limit: int) -> list[RequestRecord]:
        """Up to `limit` other records, started before `record`, that still keep their tokens
        (newest first): the prompts whose KV it could have found cached."""
        with self._lock:
            found = []
            for other in reversed(self._records):
                if other.started <= record.started and other.seq != record.seq and other.prompt_token_ids:
                    found.append(other)
                    if len(found) == limit:
                        break
            return found

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def hit_rate_series(self) -> list[HitRateBucket]:
        with self._lock:
            return [HitRateBucket(b[0], int(b[1]), int(b[2]), int(b[3])) for b in self._buckets]


def _snapshot(entry: _Live, now: float) -> LiveRequest:
    run, prefill = entry.run, entry.run.prefill
    if prefill.is_done:
        phase: Phase = "decode"
        num_cached = run.num_cached_tokens
    else:
        phase = "prefill" if prefill.num_computed_tokens else "queued"
        num_cached = prefill.num_cached_tokens
    source = entry.source
    if source is not None:  # known at admission, before the first progress report
        num_cached = max(num_cached, source.num_ram_tokens + source.num_disk_tokens)
    return LiveRequest(
        entry.request_id,
        entry.started,
        now - entry.started_mono,
        phase,
        prefill.num_prompt_tokens,
        prefill.num_computed_tokens,
        num_cached,
        source.num_disk_tokens if source is not None else 0,
        run.num_output_tokens,
    )
