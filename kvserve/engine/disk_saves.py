"""The engine's half of a checkpoint save: which sequences are worth saving when their RAM
blocks go, and copying a prefix's KV out of the pool into a SaveJob for the writer thread.

A save needs the KV of full blocks only (every checkpoint the engine writes is block
aligned, so the token-hash lookup can find all of it). Blocks are found by chain hash in
the prefix cache, or among the blocks evicted during this step, whose KV stays intact
until the next forward writes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from kvserve.engine.kv_cache.block_hash import BlockHash
from kvserve.engine.kv_cache.manager import CachedSequence, KVCacheManager
from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan, SaveReason, TextKey
from kvserve.kvstore.checkpoint_store import CheckpointStore, ChunkUnavailableError
from kvserve.kvstore.writer import SaveJob

if TYPE_CHECKING:
    from kvserve.engine.image_input import ImageInput

CopyOut = Callable[[list[int]], list[torch.Tensor]]  # ModelRunner.copy_blocks_out


class RecentSequences:
    """Released sequences (a finished conversation turn, mostly) still cached in RAM, newest last.

    When one of their blocks is about to be reused the sequence is saved (`evict`), and at
    shutdown they all are. A sequence that a newer one extends is dropped: the newer one
    covers it.
    """

    def __init__(self, max_sequences: int = 16) -> None:
        self.max_sequences = max_sequences
        self._sequences: OrderedDict[BlockHash, CachedSequence] = OrderedDict()  # by last hash
        self._watch: dict[BlockHash, set[BlockHash]] = {}  # block hash -> sequences using it
        self._evicting: set[BlockHash] = set()

    def __len__(self) -> int:
        return len(self._sequences)

    def add(self, sequence: CachedSequence) -> None:
        hashes = set(sequence.block_hashes)
        for key in [k for k in self._sequences if k in hashes]:  # prefixes of the new one
            self.remove(key)
        key = sequence.block_hashes[-1]
        self.remove(key)
        self._sequences[key] = sequence
        for block_hash in sequence.block_hashes:
            self._watch.setdefault(block_hash, set()).add(key)
        while len(self._sequences) > self.max_sequences:
            self.remove(next(iter(self._sequences)))

    def remove(self, key: BlockHash) -> CachedSequence | None:
        sequence = self._sequences.pop(key, None)
        self._evicting.discard(key)
        if sequence is not None:
            for block_hash in sequence.block_hashes:
                users = self._watch.get(block_hash)
                if users is not None:
                    users.discard(key)
                    if not users:
                        del self._watch[block_hash]
        return sequence

    def block_evicted(self, block_hash: BlockHash) -> None:
        self._evicting.update(self._watch.get(block_hash, ()))

    def take_evicting(self) -> list[CachedSequence]:
        """The sequences that lost a block since the last call, removed from the watch list."""
        taken = [self.remove(key) for key in list(self._evicting)]
        return [sequence for sequence in taken if sequence is not None]

    def newest_first(self) -> list[CachedSequence]:
        return list(reversed(self._sequences.values()))


def resolve_block_ids(
    kv: KVCacheManager, block_hashes: Sequence[BlockHash], evicted: Mapping[BlockHash, int]
) -> list[int] | None:
    """The pool blocks holding these hashes' KV (cached, or evicted this step); None if one is gone."""
    block_ids = []
    for block_hash in block_hashes:
        block = kv.lookup(block_hash)
        block_id = block.block_id if block is not None else evicted.get(block_hash)
        if block_id is None:
            return None
        block_ids.append(block_id)
    return block_ids


def build_save_job(
    store: CheckpointStore,
    meta: CheckpointMeta,
    token_ids: list[int],
    block_hashes: list[BlockHash],
    block_ids: list[int],
    copy_out: CopyOut,
    supersedes: str | None = None,
) -> tuple[SaveJob, int]:
    """Copy out the KV of the chunks the store lacks (one copy of the blocks covering them)
    and wrap it in a job; the provider serves slices of that copy. Also returns how many
    tokens those chunks hold (what the save adds to the disk)."""
    block_size = store.identity.block_size
    missing = store.missing_spans(token_ids, block_hashes)
    copies: dict[str, list[torch.Tensor]] = {}
    if missing:
        first = min(span.start for span in missing) // block_size
        last = max(span.end for span in missing) // block_size
        kv = copy_out(block_ids[first:last])
        base = first * block_size
        for span in missing:
            copies[span.key] = [layer[:, span.start - base : span.end - base] for layer in kv]

    def provider(span: ChunkSpan) -> list[torch.Tensor]:
        if span.key not in copies:  # stored when checked, deleted since
            raise ChunkUnavailableError(span.key)
        return copies[span.key]

    num_new_tokens = sum(span.num_tokens for span in missing)
    num_bytes = sum(layer.numel() * layer.element_size() for layer in kv) if missing else 0
    job = SaveJob(meta, tuple(token_ids), tuple(block_hashes), provider, supersedes, num_bytes)
    return job, num_new_tokens


def new_meta(
    store: CheckpointStore,
    text_of: Callable[[Sequence[int]], str],
    token_ids: list[int],
    reason: SaveReason,
    images: Sequence[ImageInput] = (),
) -> CheckpointMeta:
    """A checkpoint's id is its text's SHA1 (one checkpoint per rendered text, as in the reference).
    The text of an image prompt holds only placeholders, so the images' content hashes and offsets
    are appended to what is hashed: the same text with another image is another checkpoint, not a
    duplicate that is skipped. (Such an id never matches a text-prefix lookup; image prompts find
    their KV by block hashes, which carry the images.)"""
    text = text_of(token_ids)
    key = TextKey.of(text)
    if images:
        salted = TextKey.of(text + "\x00" + ";".join(f"{i.content_hash}@{i.offset}" for i in images))
        key = TextKey(salted.sha1, key.num_bytes)
    return CheckpointMeta.new(store.identity, key, len(token_ids), reason)
