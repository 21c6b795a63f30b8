"""Chain hashes of full KV blocks: equal hash <=> equal token prefix under the same model.

A block's hash covers its parent's hash, its own token ids and an extra key (the model
fingerprint), so one hash names the whole prefix up to the end of the block. The hashes
are stable across processes and machines (fixed-seed xxh3, little-endian encoding): the
disk tier keys its chunks by them.

A block that an image's span touches has the image in its extra key too (its content hash and
offset, as vLLM's `extra_keys`), so the same placeholder tokens with another image never match,
and a changed image breaks a prefix match at the first block holding its tokens (the chain carries
it to every later block). Blocks no image touches hash exactly as they would without images.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import xxhash

from kvserve.engine.image_input import ImageInput

BlockHash = int  # a 128-bit xxh3 digest

_HASH_BYTES = 16
_ROOT_PARENT = b"\x00" * _HASH_BYTES  # parent of a sequence's first block


def _extra_key_bytes(extra_key: bytes | str) -> bytes:
    return extra_key.encode() if isinstance(extra_key, str) else extra_key


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    encoded = array("q", token_ids)
    if sys.byteorder != "little":  # keep hashes identical on every machine
        encoded.byteswap()
    return encoded.tobytes()


def hash_block_tokens(
    parent_hash: BlockHash | None, token_ids: Sequence[int], extra_key: bytes | str = b""
) -> BlockHash:
    """Hash of one block given its parent's hash (None for the first block)."""
    hasher = xxhash.xxh3_128()
    hasher.update(_ROOT_PARENT if parent_hash is None else parent_hash.to_bytes(_HASH_BYTES, "little"))
    # NOTE: the extra key is length-prefixed so (key, tokens) pairs can never collide by concatenation.
    key = _extra_key_bytes(extra_key)
    hasher.update(len(key).to_bytes(4, "little"))
    hasher.update(key)
    hasher.update(_token_bytes(token_ids))
    return hasher.intdigest()


def compute_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    extra_key: bytes | str = b"",
    start_hashes: Sequence[BlockHash] = (),
    images: Sequence[ImageInput] = (),
) -> list[BlockHash]:
    """Chain hashes of every full block of `token_ids`.

    `start_hashes` are already-known hashes of the leading blocks (from an earlier call on
    a prefix of the same tokens); only the blocks after them are hashed, so a growing
    sequence is hashed incrementally. The returned list starts with `start_hashes`.
    `images` (in prompt order) enter the extra key of the blocks their spans touch.
    """
    assert block_size > 0
    hashes = list(start_hashes)
    parent = hashes[-1] if hashes else None
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        end = start + block_size
        key = _with_images(extra_key, images, start, end) if images else extra_key
        parent = hash_block_tokens(parent, token_ids[start:end], key)
        hashes.append(parent)
    return hashes


def _with_images(extra_key: bytes | str, images: Sequence[ImageInput], start: int, end: int) -> bytes | str:
    """The block [start, end)'s extra key: `extra_key`, then a NUL (which no cache key contains, so
    no text-only key can equal an image block's) and each touching image's length-prefixed content
    hash and 8-byte offset."""
    touching = [image for image in images if image.overlaps(start, end)]
    if not touching:
        return extra_key
    parts = [_extra_key_bytes(extra_key), b"\x00"]
    for image in touching:
        content = image.content_hash.encode()
        parts += [len(content).to_bytes(4, "little"), content, image.offset.to_bytes(8, "little")]
    return b"".join(parts)
