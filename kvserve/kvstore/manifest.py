"""On-disk format of a checkpoint manifest: metadata, the exact token ids and the list of
chunks holding its KV. Small (a few bytes per token), rewritten whole on every hit.

    magic "KVSM" | u16 format version | u16 reserved | u32 JSON bytes | u32 num_tokens
    u64 xxh3-64 of the JSON and token bytes
    JSON metadata (identity, text key, reason, times, hits, chunks as [key, start, end])
    u32 token ids [num_tokens]
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import xxhash

from kvserve.kvstore.checkpoint import SAVE_REASONS, CheckpointMeta, ChunkSpan, StoreIdentity, TextKey
from kvserve.kvstore.names import is_checkpoint_id, is_chunk_key

MANIFEST_VERSION = 1
MAGIC = b"KVSM"
HEADER = struct.Struct("<4sHHIIQ")


class CorruptManifestError(ValueError):
    """A manifest is truncated, fails its hash, or holds inconsistent data."""


class IncompatibleManifestError(ValueError):
    """A manifest written by another format version (or, checked by the store, another model)."""


class Manifest(NamedTuple):
    meta: CheckpointMeta
    token_ids: list[int]
    chunks: list[ChunkSpan]


def encode_manifest(meta: CheckpointMeta, token_ids: Sequence[int], chunks: Sequence[ChunkSpan]) -> bytes:
    assert len(token_ids) == meta.num_tokens and chunks and chunks[-1].end == meta.num_tokens
    document = {
        "identity": vars(meta.identity),
        "text_sha1": meta.text.sha1,
        "text_bytes": meta.text.num_bytes,
        "num_tokens": meta.num_tokens,
        "reason": meta.reason,
        "created": meta.created,
        "last_used": meta.last_used,
        "hits": meta.hits,
        "chunks": [list(span) for span in chunks],
    }
    body = json.dumps(document, separators=(",", ":")).encode()
    tokens = np.asarray(token_ids, dtype="<u4").tobytes()
    digest = xxhash.xxh3_64_intdigest(body + tokens)
    return HEADER.pack(MAGIC, MANIFEST_VERSION, 0, len(body), len(token_ids), digest) + body + tokens


def decode_manifest(data: bytes) -> Manifest:
    if len(data) < HEADER.size:
        raise CorruptManifestError("truncated header")
    magic, version, _, body_len, num_tokens, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptManifestError("bad magic")
    if version != MANIFEST_VERSION:
        raise IncompatibleManifestError(f"manifest version {version}, this build reads {MANIFEST_VERSION}")
    rest = data[HEADER.size :]
    if len(rest) != body_len + 4 * num_tokens or xxhash.xxh3_64_intdigest(rest) != digest:
        raise CorruptManifestError("truncated or failing its hash")
    try:
        return _parse(json.loads(rest[:body_len]), np.frombuffer(rest[body_len:], dtype="<u4").tolist())
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptManifestError(f"bad metadata: {error}") from error


def _parse(document: dict, token_ids: list[int]) -> Manifest:
    meta = CheckpointMeta(
        identity=StoreIdentity(**document["identity"]),
        text=TextKey(str(document["text_sha1"]), int(document["text_bytes"])),
        num_tokens=int(document["num_tokens"]),
        reason=document["reason"],
        created=float(document["created"]),
        last_used=float(document["last_used"]),
        hits=int(document["hits"]),
    )
    chunks = [ChunkSpan(str(key), int(start), int(end)) for key, start, end in document["chunks"]]
    contiguous = all(a.end == b.start for a, b in itertools.pairwise(chunks))
    if (
        meta.reason not in SAVE_REASONS
        or not is_checkpoint_id(meta.checkpoint_id)
        or not all(is_chunk_key(span.key) for span in chunks)  # a name is never a path elsewhere
        or meta.num_tokens != len(token_ids)
        or not chunks
        or chunks[0].start != 0
        or chunks[-1].end != meta.num_tokens
        or not contiguous
    ):
        raise CorruptManifestError("inconsistent metadata")
    return Manifest(meta, token_ids, chunks)
