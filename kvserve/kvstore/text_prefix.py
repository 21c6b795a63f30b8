"""Longest stored rendered-text prefix of a prompt (pure).

Checkpoints are keyed by SHA1 and byte length of their rendered text, so a prompt is
matched by hashing its own prefix at every stored length. The lengths are visited in
ascending order with one running SHA1, so the whole search reads the prompt once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from kvserve.kvstore.checkpoint import TextKey


def longest_text_prefix(text: bytes, candidates: Iterable[TextKey]) -> TextKey | None:
    """The longest candidate whose text is a byte prefix of `text`, or None."""
    by_length: dict[int, set[str]] = {}
    for candidate in candidates:
        if candidate.num_bytes <= len(text):
            by_length.setdefault(candidate.num_bytes, set()).add(candidate.sha1)
    hasher = hashlib.sha1()
    position = 0
    best = None
    for length in sorted(by_length):
        hasher.update(text[position:length])
        position = length
        digest = hasher.hexdigest()
        if digest in by_length[length]:
            best = TextKey(digest, length)
    return best
