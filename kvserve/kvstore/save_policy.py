"""When to write a checkpoint and where to cut it (pure; reference ds4-server §4.2).

`cold`: after the first prefill of a prompt that had no reuse, store the prefix up to the
chat task boundary (just before the last user-turn start that precedes the first assistant
turn: the system prompt, tools and earlier turns, which the next request will repeat), else
the prompt minus a small trim, aligned down. `continued`: at absolute aligned frontiers, so
any conversation crossing 10,240, 20,480, ... tokens leaves a checkpoint there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SavePolicy:
    min_tokens: int = 512  # shorter prefixes are cheaper to prefill than to load
    cold_max_tokens: int = 30000
    cold_trim_tokens: int = 32  # leave the prompt's tail (likely to change) out of a cold store
    align_tokens: int = 2048
    continued_interval_tokens: int = 10000

    @property
    def continued_step(self) -> int:
        """The interval rounded up to the alignment (10000 -> 10240)."""
        if self.align_tokens <= 0:
            return self.continued_interval_tokens
        return -(-self.continued_interval_tokens // self.align_tokens) * self.align_tokens


DEFAULT_SAVE_POLICY = SavePolicy()


def _find(token_ids: Sequence[int], pattern: Sequence[int], start: int, stop: int) -> list[int]:
    """Start indexes of `pattern` within token_ids[start:stop]."""
    width = len(pattern)
    first = pattern[0]
    return [
        i
        for i in range(start, stop - width + 1)
        if token_ids[i] == first and list(token_ids[i : i + width]) == list(pattern)
    ]


def chat_anchor_pos(
    token_ids: Sequence[int], user_start: Sequence[int], assistant_start: Sequence[int]
) -> int | None:
    """Index of the last user-turn start before the first assistant-turn start, or None.

    Turn starts are token sequences (ChatML `<|im_start|>user` is two tokens; Llama 3 uses
    three), so the caller passes each template's markers.
    """
    if not user_start or not assistant_start:
        return None
    assistant = _find(token_ids, assistant_start, 0, len(token_ids))
    if not assistant:
        return None
    users = _find(token_ids, user_start, 0, assistant[0])
    return users[-1] if users else None


def system_cut(token_ids: Sequence[int], user_start: Sequence[int]) -> int | None:
    """Length of the system prompt + tools prefix (`agent_system`): up to the first user-turn
    start, or None when the template has no marker or the prompt no user turn."""
    if not user_start:
        return None
    starts = _find(token_ids, user_start, 0, len(token_ids))
    return starts[0] if starts else None


def cold_store_len(num_tokens: int, policy: SavePolicy = DEFAULT_SAVE_POLICY) -> int:
    """Trim and align down (11011 -> 10240); short prompts are stored whole (1695 -> 1695)."""
    if num_tokens <= policy.min_tokens + policy.cold_trim_tokens:
        return num_tokens
    length = num_tokens - policy.cold_trim_tokens
    if policy.align_tokens > 0:
        length -= length % policy.align_tokens
    return length if length >= policy.min_tokens else num_tokens


def cold_cut(
    token_ids: Sequence[int],
    user_start: Sequence[int] = (),
    assistant_start: Sequence[int] = (),
    policy: SavePolicy = DEFAULT_SAVE_POLICY,
) -> int | None:
    """Length of the `cold` checkpoint for a freshly prefilled prompt, or None to skip."""
    num_tokens = len(token_ids)
    if not policy.min_tokens <= num_tokens <= policy.cold_max_tokens:
        return None
    anchor = chat_anchor_pos(token_ids, user_start, assistant_start)
    if anchor is not None and anchor >= policy.min_tokens:
        return anchor
    return cold_store_len(num_tokens, policy)


def continued_frontier(
    num_computed_tokens: int, last_stored_tokens: int, policy: SavePolicy = DEFAULT_SAVE_POLICY
) -> int | None:
    """The newest absolute frontier reached and not yet stored, or None.

    Paged KV keeps every computed block, so the engine need not stop exactly on a frontier:
    any time after crossing it, the prefix up to it can be copied out.
    """
    step = policy.continued_step
    if step <= 0:
        return None
    frontier = num_computed_tokens // step * step
    if frontier < policy.min_tokens or frontier <= last_stored_tokens:
        return None
    return frontier
