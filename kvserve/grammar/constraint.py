"""GrammarConstraint: the engine's TokenConstraint over an llguidance matcher.

Optionally carries a StructureTracker (`structure.py`), which says when the next token is tool-call
markup (sampled greedily) rather than payload (sampled at the request's temperature). A constraint
without a matcher only tracks structure: `tool_choice: "auto"` masks nothing.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Protocol

import llguidance


class StructureTracker(Protocol):
    """Follows the generated tokens; `is_structural` is about the next one."""

    @property
    def is_structural(self) -> bool: ...

    def feed_token(self, token_id: int) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class ConstraintRecipe:
    """How to build a constraint again elsewhere (the engine process, `engine/process_client.py`):
    the Lark grammar (None: no mask) and the tool syntax whose markup is greedy (None: no tracker).
    Built against the same tokenizer, it is the same constraint."""

    lark: str | None
    tracker_syntax: str | None = None


class GrammarConstraint:
    recipe: ConstraintRecipe | None = None  # set by whoever knows how it was made

    def __init__(
        self,
        matcher: llguidance.LLMatcher | None,
        tracker: StructureTracker | None = None,
        vocab_size: int = 0,
    ):
        """`vocab_size`: the matcher's tokenizer's vocabulary (its bitmask is ceil(vocab_size / 32) words)."""
        assert matcher is not None or tracker is not None
        self._matcher = matcher
        self._mask_bytes = (vocab_size + 31) // 32 * 4
        self._tracker = tracker
        self._num_accepted = 0

    @property
    def is_masking(self) -> bool:
        return self._matcher is not None

    @property
    def is_greedy(self) -> bool:
        return self._tracker is not None and self._tracker.is_structural

    @property
    def is_finished(self) -> bool:
        m = self._matcher
        return m is not None and m.is_stopped() and not m.is_error()

    @property
    def error(self) -> str | None:
        if self._matcher is None or not self._matcher.is_error():
            return None
        return self._matcher.get_error().strip().splitlines()[0]

    @property
    def num_accepted_tokens(self) -> int:
        return self._num_accepted

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        assert self._matcher is not None
        if num_bytes == self._mask_bytes:
            self._matcher.unsafe_compute_mask_ptr(address, num_bytes)
            return
        # The model's logits and the tokenizer disagree on the vocabulary size: copy what overlaps
        # (tokens the tokenizer does not know stay disallowed; the caller zeroed the row).
        mask = self._matcher.compute_bitmask()
        ctypes.memmove(address, mask, min(len(mask), num_bytes))

    def accept_token(self, token_id: int) -> bool:
        self._num_accepted += 1
        if self._tracker is not None:
            self._tracker.feed_token(token_id)
        return self._matcher is None or self._matcher.consume_token(token_id)

    def reset(self) -> None:
        self._num_accepted = 0
        if self._matcher is not None:
            self._matcher.reset()
        if self._tracker is not None:
            self._tracker.reset()
