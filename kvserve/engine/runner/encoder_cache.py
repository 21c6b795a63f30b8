"""EncoderCache: vision-encoder outputs kept by image content hash, least recently used first out.

A client resends the whole conversation every turn, images included, and a retry resends the same
request: with the encoder's rows kept, neither runs the vision tower again (the KV blocks of the
image's tokens may well be cached too, but a prompt that diverges inside or before the image, or a
chunk that starts inside it, needs the rows themselves).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EncoderCacheStats:
    num_hits: int  # lookups of an image a step needs that found its rows
    num_misses: int  # lookups that had to encode it
    num_entries: int
    num_bytes: int


class EncoderCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._rows: OrderedDict[str, torch.Tensor] = OrderedDict()  # oldest use first
        self._num_bytes = 0
        self._num_hits = self._num_misses = 0

    def get(self, content_hash: str, num_rows: int) -> torch.Tensor | None:
        """The rows [num_rows, hidden] kept for this image, or None (a miss). Rows of another count
        under the same hash (pixels preprocessed otherwise) are a miss, never a wrong answer."""
        rows = self._rows.get(content_hash)
        if rows is None or rows.shape[0] != num_rows:
            self._num_misses += 1
            return None
        self._rows.move_to_end(content_hash)
        self._num_hits += 1
        return rows

    def put(self, content_hash: str, rows: torch.Tensor) -> None:
        """Keep `rows`, dropping the least recently used entries to stay within the capacity (rows
        larger than all of it are not kept)."""
        size = rows.numel() * rows.element_size()
        old = self._rows.pop(content_hash, None)
        if old is not None:
            self._num_bytes -= old.numel() * old.element_size()
        if size > self.capacity_bytes:
            return
        while self._num_bytes + size > self.capacity_bytes:
            _, evicted = self._rows.popitem(last=False)
            self._num_bytes -= evicted.numel() * evicted.element_size()
        self._rows[content_hash] = rows
        self._num_bytes += size

    def stats(self) -> EncoderCacheStats:
        return EncoderCacheStats(self._num_hits, self._num_misses, len(self._rows), self._num_bytes)
