"""ChunkStore: the content-addressed chunk files of one cache directory (`<key>.kvc`).

A chunk is written once and never modified; whether it is still needed is the index's
business (chunk reference counts), not this class's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.kvstore.atomic_file import ensure_private_dir, fsync_dir, is_temp_file, write_atomic
from kvserve.kvstore.checkpoint import ChunkSpan, LoadedKV, StoreIdentity
from kvserve.kvstore.chunk_format import (
    HEADER,
    CorruptChunkError,
    check_header,
    decode_chunk,
    decode_header,
    encode_chunk,
)
from kvserve.kvstore.names import checked_chunk_key, is_chunk_key

if TYPE_CHECKING:
    import torch

SUFFIX = ".kvc"

# Reads and verifies one chunk: its token ids and per-layer KV (a local file, or a shared object).
ChunkReader = Callable[[ChunkSpan], tuple[list[int], list["torch.Tensor"]]]


def read_run(spans: Sequence[ChunkSpan], identity: StoreIdentity, read: ChunkReader) -> LoadedKV:
    """Consecutive chunks read by `read`, joined into one KV per layer; raises CorruptChunkError
    naming the first bad chunk (its `key` attribute)."""
    token_ids: list[int] = []
    layers: list[list[torch.Tensor]] = [[] for _ in range(identity.num_layers)]
    for span in spans:
        try:
            chunk_tokens, chunk_layers = read(span)
        except CorruptChunkError as error:
            error.key = span.key
            raise
        token_ids += chunk_tokens
        for parts, tensor in zip(layers, chunk_layers, strict=True):
            parts.append(tensor)
    import torch

    # [2, num_tokens, num_kv_heads, head_dim] per layer, owning its memory
    kv = [parts[0].clone() if len(parts) == 1 else torch.cat(parts, dim=1) for parts in layers]
    return LoadedKV(tuple(token_ids), kv)


class ChunkStore:
    def __init__(self, directory: Path, identity: StoreIdentity) -> None:
        ensure_private_dir(directory)
        self.directory = directory
        self.identity = identity

    def path(self, key: str) -> Path:
        """Raises UnsafeNameError for anything but a chunk key."""
        return self.directory / f"{checked_chunk_key(key)}{SUFFIX}"

    def keys_on_disk(self) -> set[str]:
        return {
            p.name[: -len(SUFFIX)]
            for p in self.directory.iterdir()
            if p.name.endswith(SUFFIX) and not is_temp_file(p) and is_chunk_key(p.name[: -len(SUFFIX)])
        }

    def write(self, span: ChunkSpan, token_ids: Sequence[int], layers: Sequence[torch.Tensor]) -> int:
        """Write one chunk (atomically; the caller fsyncs the directory once per batch)."""
        pieces = encode_chunk(self.identity, span, token_ids, layers)
        return write_atomic(self.path(span.key), pieces, sync_dir=False)

    def sync(self) -> None:
        fsync_dir(self.directory)

    def read(self, span: ChunkSpan) -> tuple[list[int], list[torch.Tensor]]:
        """Read and fully verify a chunk; raises CorruptChunkError (a missing file included)."""
        try:
            data = bytearray(self.path(span.key).read_bytes())
        except FileNotFoundError as error:
            raise CorruptChunkError(f"chunk {span.key} is missing") from error
        return decode_chunk(data, self.identity, span)

    def read_run(self, spans: Sequence[ChunkSpan]) -> LoadedKV:
        """Read consecutive chunks into one KV per layer; raises CorruptChunkError naming the
        first bad chunk (its `key` attribute)."""
        return read_run(spans, self.identity, self.read)

    def check(self, span: ChunkSpan) -> int:
        """Cheap check (header and size, no payload hash) used when rebuilding the index;
        returns the file size or raises CorruptChunkError."""
        path = self.path(span.key)
        try:
            with path.open("rb") as f:
                head = f.read(HEADER.size)
            size = path.stat().st_size
        except FileNotFoundError as error:
            raise CorruptChunkError(f"chunk {span.key} is missing") from error
        check_header(decode_header(head), size, self.identity, span)
        return size

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)
