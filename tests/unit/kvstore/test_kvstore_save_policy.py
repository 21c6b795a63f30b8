"""Save-trigger policy: cold cut points and continued frontiers (reference ds4-server §4.2)."""

from __future__ import annotations

import pytest

from kvserve.kvstore.save_policy import (
    SavePolicy,
    chat_anchor_pos,
    cold_cut,
    cold_store_len,
    continued_frontier,
)

USER = (7, 1)  # a two-token user-turn start, like ChatML's `<|im_start|>` `user`
ASSISTANT = (7, 2)


@pytest.mark.parametrize(
    ("num_tokens", "policy", "expected"),
    [
        (11011, SavePolicy(), 10240),
        (1695, SavePolicy(), 1695),  # (1695 - 32) aligned down is 0 < 512: store it whole
        (544, SavePolicy(), 544),  # not more than min + trim
        (4200, SavePolicy(), 4096),
        (3500, SavePolicy(cold_trim_tokens=0, align_tokens=1000), 3000),
        (3500, SavePolicy(align_tokens=0), 3468),
        (3500, SavePolicy(cold_trim_tokens=0, align_tokens=0), 3500),
    ],
)
def test_cold_store_len_matches_the_reference(num_tokens: int, policy: SavePolicy, expected: int) -> None:
    assert cold_store_len(num_tokens, policy) == expected


def conversation(system: int, turns: list[tuple[int, int]]) -> list[int]:
    """`system` filler tokens, then (user, assistant) turns of the given lengths (0 = no reply)."""
    tokens = [5] * system
    for user_len, assistant_len in turns:
        tokens += [*USER, *([3] * user_len)]
        if assistant_len:
            tokens += [*ASSISTANT, *([4] * assistant_len)]
    return tokens


def test_anchor_is_the_last_user_start_before_the_first_assistant_turn() -> None:
    tokens = conversation(600, [(100, 0)]) + [*ASSISTANT]  # system + one user turn + generation prompt
    assert chat_anchor_pos(tokens, USER, ASSISTANT) == 600
    multi = [5] * 300 + [*USER, 3, 3] + [5] * 400 + [*USER, 3] + [*ASSISTANT, 4] + [*USER, 3]
    assert chat_anchor_pos(multi, USER, ASSISTANT) == 704  # the second user start, not the third
    assert chat_anchor_pos([5] * 100, USER, ASSISTANT) is None
    assert chat_anchor_pos([*ASSISTANT, *USER], USER, ASSISTANT) is None
    assert chat_anchor_pos(tokens, (), ASSISTANT) is None


def test_cold_cut_prefers_the_task_boundary() -> None:
    tokens = conversation(3000, [(200, 0)]) + [*ASSISTANT]
    assert cold_cut(tokens, USER, ASSISTANT) == 3000
    assert cold_cut(tokens) == 2048  # no markers: trim and align


def test_cold_cut_falls_back_when_the_boundary_is_too_early() -> None:
    tokens = conversation(100, [(3000, 0)]) + [*ASSISTANT]
    assert cold_cut(tokens, USER, ASSISTANT) == 2048


def test_cold_cut_skips_prompts_outside_the_size_range() -> None:
    assert cold_cut([5] * 511) is None
    assert cold_cut([5] * 30001) is None
    assert cold_cut([5] * 512) == 512


def test_continued_frontiers_are_absolute_multiples_of_the_aligned_interval() -> None:
    policy = SavePolicy()
    assert policy.continued_step == 10240
    assert continued_frontier(10239, 0) is None
    assert continued_frontier(10240, 0) == 10240
    assert continued_frontier(10700, 0) == 10240  # crossed inside a prefill chunk: store the prefix
    assert continued_frontier(10700, 10240) is None  # already stored (or cut by the cold store)
    assert continued_frontier(31000, 10240) == 30720  # only the newest frontier
    assert continued_frontier(600, 0, SavePolicy(continued_interval_tokens=500, align_tokens=256)) == 512
    assert continued_frontier(300, 0, SavePolicy(continued_interval_tokens=100, align_tokens=0)) is None
