"""Cutting a token prefix into content-addressed chunks (pure).

Chunks start at absolute multiples of `chunk_tokens`, so two prefixes that agree on their
first k chunks produce the same k chunk keys and share those files. A chunk's key is the
block chain hash at its end (which names the whole prefix, model included, through the
chain and its extra key). A checkpoint's last chunk may end inside a block; its key then
chains the hash of the last full block with the remaining tokens.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence

import xxhash

from kvserve.kvstore.checkpoint import ChunkSpan

_HASH_BYTES = 16
_TAIL_DOMAIN = b"kvserve.kvstore.tail.v1"  # keeps tail keys apart from block chain hashes


def format_key(block_hash: int) -> str:
    return f"{block_hash:032x}"


def tail_key(parent_hash: int | None, tail_token_ids: Sequence[int], fingerprint: str) -> str:
    """Key of a prefix that ends inside a block: the last full block's chain hash + the rest."""
    hasher = xxhash.xxh3_128()
    hasher.update(_TAIL_DOMAIN)
    hasher.update(
        b"\x00" * _HASH_BYTES if parent_hash is None else parent_hash.to_bytes(_HASH_BYTES, "little")
    )
    key = fingerprint.encode()
    hasher.update(len(key).to_bytes(4, "little"))
    hasher.update(key)
    tokens = array("q", tail_token_ids)
    if sys.byteorder != "little":
        tokens.byteswap()
    hasher.update(tokens.tobytes())
    return format_key(hasher.intdigest())


def prefix_key(
    end: int,
    token_ids: Sequence[int],
    block_hashes: Sequence[int],
    block_size: int,
    fingerprint: str,
) -> str:
    """The key naming tokens [0, end): equal keys <=> equal prefixes under the same model."""
    num_full = end // block_size
    assert 0 < end <= len(token_ids) and num_full <= len(block_hashes), (end, len(block_hashes))
    if end % block_size == 0:
        return format_key(block_hashes[num_full - 1])
    parent = block_hashes[num_full - 1] if num_full else None
    return tail_key(parent, token_ids[num_full * block_size : end], fingerprint)


def chunk_spans(
    token_ids: Sequence[int],
    block_hashes: Sequence[int],
    block_size: int,
    chunk_tokens: int,
    fingerprint: str,
) -> list[ChunkSpan]:
    """The chunks covering all of `token_ids` (the last one possibly short)."""
    assert chunk_tokens % block_size == 0, "chunks are whole blocks, so their keys are chain hashes"
    spans = []
    for start in range(0, len(token_ids), chunk_tokens):
        end = min(start + chunk_tokens, len(token_ids))
        spans.append(ChunkSpan(prefix_key(end, token_ids, block_hashes, block_size, fingerprint), start, end))
    return spans


def longest_stored_run(
    block_hashes: Sequence[int],
    block_size: int,
    chunk_tokens: int,
    stored: Callable[[list[ChunkSpan]], set[ChunkSpan]],
) -> list[ChunkSpan]:
    """The longest chain of stored chunks that prefixes a request with these chain hashes.

    Chunk slots are walked in order; a full stored chunk extends the run, and in the first
    slot without one the longest stored shorter chunk (one ending on a block boundary, left
    by a checkpoint that ended mid-slot) ends it. `stored` filters candidate spans (one
    batched index query per slot).
    """
    blocks_per_chunk = chunk_tokens // block_size
    run: list[ChunkSpan] = []
    for slot_start in range(0, len(block_hashes), blocks_per_chunk):
        slot_hashes = block_hashes[slot_start : slot_start + blocks_per_chunk]
        start = slot_start * block_size
        candidates = [
            ChunkSpan(format_key(h), start, start + (i + 1) * block_size) for i, h in enumerate(slot_hashes)
        ]
        found = stored(candidates)
        if not found:
            break
        longest = max(found, key=lambda span: span.end)
        run.append(longest)
        if longest.end != start + chunk_tokens:
            break
    return run
