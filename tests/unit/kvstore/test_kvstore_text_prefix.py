"""Longest rendered-text prefix by SHA1 of stored byte lengths (pure)."""

from __future__ import annotations

from kvserve.kvstore.checkpoint import TextKey
from kvserve.kvstore.text_prefix import longest_text_prefix


def test_the_longest_matching_prefix_wins() -> None:
    prompt = "<|system|>tools…<|user|>fix the bug<|assistant|>"
    stored = [TextKey.of(prompt[:10]), TextKey.of(prompt[:24]), TextKey.of("<|system|>other tools")]
    assert longest_text_prefix(prompt.encode(), stored) == TextKey.of(prompt[:24])


def test_lengths_are_utf8_bytes_and_a_stored_text_longer_than_the_prompt_never_matches() -> None:
    prompt = "héllo wörld ✓ done"
    assert TextKey.of("héllo").num_bytes == 6
    assert longest_text_prefix(prompt.encode(), [TextKey.of("héllo")]) == TextKey.of("héllo")
    assert longest_text_prefix(prompt.encode(), [TextKey.of(prompt + "!")]) is None
    assert longest_text_prefix(prompt.encode(), [TextKey.of(prompt)]) == TextKey.of(prompt)
    assert longest_text_prefix(prompt.encode(), []) is None


def test_same_length_different_text_does_not_match() -> None:
    assert longest_text_prefix(b"abcdef", [TextKey.of("abd"), TextKey.of("abc")]) == TextKey.of("abc")
