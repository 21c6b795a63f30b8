"""Tool replay memory: the exact text a model sampled for its tool calls, by call id (ref §5.5).

A client replays an assistant turn's calls as JSON it may have re-serialized (other key order,
other spacing). Rendering that JSON again gives other bytes than the model sampled, other tokens,
and the next turn misses the KV prefix cache from that call on. So each finished generation's
sampled blocks (the composer's `sampled_calls`) are kept here, and a replayed turn whose calls are
all known renders the stored bytes instead (`attach_replays`).

Bounded by ids and by bytes, least recently used first out. Blocks are stored once however many
calls share them. `to_json`/`from_json` let the disk tier persist it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.chat.conversation import ChatRequest, Message

DEFAULT_MAX_IDS = 100_000
DEFAULT_MAX_BYTES = 512 * 2**20
JSON_VERSION = 1
# Encoders give the composer's 32 hex a protocol prefix; clients replay the prefixed id.
_CLIENT_PREFIXES = ("call_", "toolu_")
_HEX32 = re.compile(r"[0-9a-f]{32}")


def call_key(call_id: str) -> str:
    """The memory's key for a client-facing call id: `call_<hex>` and `toolu_<hex>` are one call."""
    for prefix in _CLIENT_PREFIXES:
        if call_id.startswith(prefix) and _HEX32.fullmatch(call_id[len(prefix) :]):
            return call_id[len(prefix) :]
    return call_id


@dataclass
class _Block:
    """One sampled block, stored once even when turns sampled the same text (an agent repeating `ls`)."""

    text: str
    num_calls: int  # calls the block holds
    num_bytes: int
    num_refs: int = 0  # ids in the memory that point here


class ToolReplayMemory:
    """Thread-safe: requests render in worker threads while finished generations remember."""

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self.num_hits = 0
        self.num_misses = 0
        self.num_changes = 0  # bumped by remember/merge: lets a saver tell whether to write again
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, str] = OrderedDict()  # call key -> block text; LRU, oldest first
        self._blocks: dict[str, _Block] = {}
        self._num_bytes = 0

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def remember(self, blocks: Iterable[tuple[str, Sequence[str]]]) -> None:
        """`blocks`: each sampled block's exact markup and the ids of the calls it holds (the
        composer's `sampled_blocks`)."""
        with self._lock:
            for text, call_ids in blocks:
                if call_ids:
                    self._add(text, len(call_ids), [call_key(i) for i in call_ids])
            self._evict()
            self.num_changes += 1

    def replay(self, call_ids: Sequence[str]) -> str | None:
        """The sampled text of these calls' blocks, in order; None unless every call is known and the
        blocks hold no call the turn lacks (replaying those would invent a call)."""
        keys = [call_key(i) for i in call_ids]
        with self._lock:
            texts = [self._ids.get(k) for k in keys]
            blocks = [self._blocks[t] for t in dict.fromkeys(texts) if t is not None]
            if not keys or None in texts or sum(b.num_calls for b in blocks) != len(keys):
                self.num_misses += 1
                return None
            for key in keys:
                self._ids.move_to_end(key)
            self.num_hits += 1
            return "".join(b.text for b in blocks)

    def knows(self, call_id: str) -> bool:
        with self._lock:
            return call_key(call_id) in self._ids

    def to_json(self, call_ids: Iterable[str] | None = None) -> dict[str, Any]:
        """A JSON-able snapshot (blocks once each, ids in LRU order) for the disk tier: the whole
        memory, or only the given calls (e.g. those a checkpoint's prompt replays)."""
        wanted = None if call_ids is None else {call_key(i) for i in call_ids}
        with self._lock:
            entries = [(k, t) for k, t in self._ids.items() if wanted is None or k in wanted]
            texts = list(dict.fromkeys(t for _, t in entries))
            index = {t: i for i, t in enumerate(texts)}
            return {
                "version": JSON_VERSION,
                "blocks": [{"text": t, "num_calls": self._blocks[t].num_calls} for t in texts],
                "lru": [[key, index[text]] for key, text in entries],
            }

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], max_ids: int = DEFAULT_MAX_IDS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> ToolReplayMemory:
        """The memory `to_json` saved; raises ValueError on another version or a malformed snapshot."""
        memory = cls(max_ids, max_bytes)
        memory.merge_json(data)
        return memory

    def merge_json(self, data: Mapping[str, Any]) -> None:
        """Add a snapshot's calls (as the most recently used, in its order); ValueError if malformed."""
        if not isinstance(data, Mapping) or data.get("version") != JSON_VERSION:
            version = data.get("version") if isinstance(data, Mapping) else None
            raise ValueError(f"tool memory snapshot version {version!r} is not {JSON_VERSION}")
        try:
            blocks = [(b["text"], int(b["num_calls"])) for b in data["blocks"]]
            entries = [(key, *blocks[i]) for key, i in data["lru"]]
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise ValueError(f"malformed tool memory snapshot: {error!r}") from error
        with self._lock:
            for key, text, num_calls in entries:
                if isinstance(key, str) and isinstance(text, str) and num_calls > 0:
                    self._add(text, num_calls, (key,))
            self._evict()

    # -- bookkeeping (lock held) -------------------------------------------------------

    def _add(self, text: str, num_calls: int, keys: Iterable[str]) -> None:
        block = self._blocks.get(text)
        if block is None:
            block = self._blocks[text] = _Block(text, num_calls, len(text.encode("utf-8", "surrogatepass")))
            self._num_bytes += block.num_bytes
        for key in keys:
            old = self._ids.pop(key, None)
            self._ids[key] = text
            if old == text:
                continue
            if old is not None:
                self._release(old)
            block.num_refs += 1

    def _release(self, text: str) -> None:
        block = self._blocks[text]
        block.num_refs -= 1
        if block.num_refs == 0:
            del self._blocks[text]
            self._num_bytes -= block.num_bytes

    def _evict(self) -> None:
        while self._ids and (len(self._ids) > self.max_ids or self._num_bytes > self.max_bytes):
            _, text = self._ids.popitem(last=False)
            self._release(text)


def attach_replays(request: ChatRequest, memory: ToolReplayMemory) -> ChatRequest:
    """The request with `Message.replay` set on every assistant turn whose calls were sampled here."""
    messages = tuple(_with_replay(m, memory) for m in request.messages)
    if all(new is old for new, old in zip(messages, request.messages, strict=True)):
        return request
    return dataclasses.replace(request, messages=messages)


def _with_replay(message: Message, memory: ToolReplayMemory) -> Message:
    calls = message.tool_calls
    if message.role != "assistant" or not calls or message.replay is not None:
        return message
    text = memory.replay([c.id for c in calls])
    return message if text is None else dataclasses.replace(message, replay=text)
