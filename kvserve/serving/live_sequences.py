"""Live sequences: the exact tokens of generations that ended in tool calls, by their call ids.

A client answers tool calls with their results (Responses `function_call_output`, Anthropic
`tool_result`). The turn that produced the calls is then continued from its exact token ids
(prompt + sampled output) rather than from a re-rendering of the history, which may tokenize
differently or lack the hidden reasoning; see tool_continuation.py. Bounded LRU by sequences and
by tokens; the engine's prefix cache still holds the KV of recent ones.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvserve.chat.conversation import ChatRequest, Message
from kvserve.serving.conversation_codec import encode_messages

DEFAULT_MAX_SEQUENCES = 256
# Ids are kept as 4-byte ints (about 16 MB) plus the text (a few bytes a token).
DEFAULT_MAX_TOKENS = 4_000_000


@dataclass(frozen=True)
class LiveSequence:
    """`call_ids` are memory keys (tool_memory.call_key). `end_text` is the text of the final token when
    it ended the turn (EOS), else "": continuations keep or replace it by what the template writes."""

    call_ids: tuple[str, ...]
    token_ids: Sequence[int]  # an array('i') in the server: a long agent context is 100K+ tokens
    text: str
    end_text: str
    fingerprint: str  # of the conversation that was rendered into the prompt (request_fingerprint)


def request_fingerprint(request: ChatRequest, messages: Iterable[Message]) -> str:
    """What the prompt of `messages` rendered under `request`'s settings depends on, as one hash.
    Not tool_choice: it renders only through `active_tools` ("none"), and a forced call's turn is
    continued by the next one, which forces nothing."""
    data: dict[str, Any] = {
        "messages": encode_messages(list(messages)),
        "tools": [asdict(t) for t in request.active_tools],
        "reasoning": asdict(request.reasoning),
    }
    text = json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class LiveSequences:
    """Thread-safe (prepare runs in worker threads, generations finish on the event loop)."""

    def __init__(self, max_sequences: int = DEFAULT_MAX_SEQUENCES, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._sequences: OrderedDict[frozenset[str], LiveSequence] = OrderedDict()  # LRU, oldest first
        self._num_tokens = 0

    def __len__(self) -> int:
        return len(self._sequences)

    def save(self, sequence: LiveSequence) -> None:
        key = frozenset(sequence.call_ids)
        with self._lock:
            self._drop(key)
            self._sequences[key] = sequence
            self._num_tokens += len(sequence.token_ids)
            while self._sequences and (
                len(self._sequences) > self.max_sequences or self._num_tokens > self.max_tokens
            ):
                self._drop(next(iter(self._sequences)))

    def lookup(self, call_ids: frozenset[str]) -> LiveSequence | None:
        """The sequence whose calls are exactly these (ids as memory keys)."""
        with self._lock:
            sequence = self._sequences.get(call_ids)
            if sequence is not None:
                self._sequences.move_to_end(call_ids)
            return sequence

    def knows(self, call_id: str) -> bool:
        with self._lock:
            return any(call_id in key for key in self._sequences)

    def _drop(self, key: frozenset[str]) -> None:
        old = self._sequences.pop(key, None)
        if old is not None:
            self._num_tokens -= len(old.token_ids)
