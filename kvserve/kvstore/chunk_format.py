"""On-disk format of one chunk: a fixed header, then the chunk's token ids and its KV for
every layer as raw tensor bytes (bf16 stays raw 16-bit, no conversion).

    header (little-endian, HEADER.size bytes)
      magic "KVSC" | u16 format version | u8 dtype code | u8 reserved
      u32 num_layers | u32 num_kv_heads | u32 head_dim | u32 start | u32 num_tokens
      u64 payload bytes | 16B identity digest | 16B chunk key | 16B payload xxh3-128
      u64 xxh3-64 of everything above
    payload
      u32 token ids [num_tokens]
      per layer: [2, num_tokens, num_kv_heads, head_dim] in the cache dtype (K then V)

Bump FORMAT_VERSION on any change: readers reject other versions, and the store deletes them.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import xxhash

from kvserve.kvstore.checkpoint import ChunkSpan, StoreIdentity

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
MAGIC = b"KVSC"
HEADER = struct.Struct("<4sHBB5IQ16s16s16sQ")
_DTYPE_CODES = {"float32": 1, "bfloat16": 2, "float16": 3}

assert sys.byteorder == "little", "the chunk format stores native little-endian tensors"


class CorruptChunkError(ValueError):
    """A chunk file is truncated, fails its hashes, or does not match what refers to it."""

    key: str = ""  # the chunk's key, once known


class ChunkHeader(NamedTuple):
    version: int
    dtype_code: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    start: int
    num_tokens: int
    payload_bytes: int
    identity_digest: bytes
    key: bytes
    payload_hash: bytes


def identity_digest(identity: StoreIdentity) -> bytes:
    fields = (identity.fingerprint, identity.dtype, identity.num_layers, identity.num_kv_heads)
    text = "\x00".join(map(str, (*fields, identity.head_dim, identity.block_size)))
    return xxhash.xxh3_128_digest(text.encode())


def chunk_file_size(identity: StoreIdentity, num_tokens: int) -> int:
    """Exact size of a chunk file, known before its KV is copied out (for the budget)."""
    return HEADER.size + num_tokens * (4 + identity.bytes_per_token)


def _layer_bytes(tensor: torch.Tensor, identity: StoreIdentity, span: ChunkSpan) -> memoryview:
    import torch  # here: headers and hashes need no torch (`kvserve kv ls` reads them without it)

    expected = (2, span.num_tokens, identity.num_kv_heads, identity.head_dim)
    if tuple(tensor.shape) != expected or tensor.dtype != identity.torch_dtype:
        raise ValueError(
            f"chunk tensor {tuple(tensor.shape)} {tensor.dtype}, expected {expected} {identity.dtype}"
        )
    flat = tensor.detach().to("cpu").contiguous().view(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def encode_chunk(
    identity: StoreIdentity, span: ChunkSpan, token_ids: Sequence[int], layers: Sequence[torch.Tensor]
) -> list[bytes | memoryview]:
    """The pieces of one chunk file, header first (written without joining them)."""
    if len(layers) != identity.num_layers or len(token_ids) != span.num_tokens:
        raise ValueError(
            f"chunk has {len(layers)} layers / {len(token_ids)} tokens, expected "
            f"{identity.num_layers} / {span.num_tokens}"
        )
    payload: list[bytes | memoryview] = [np.asarray(token_ids, dtype="<u4").tobytes()]
    payload += [_layer_bytes(layer, identity, span) for layer in layers]
    hasher = xxhash.xxh3_128()
    for piece in payload:
        hasher.update(piece)
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        _DTYPE_CODES[identity.dtype],
        0,
        identity.num_layers,
        identity.num_kv_heads,
        identity.head_dim,
        span.start,
        span.num_tokens,
        sum(len(piece) for piece in payload),
        identity_digest(identity),
        bytes.fromhex(span.key),
        hasher.digest(),
        0,
    )
    header = header[:-8] + struct.pack("<Q", xxhash.xxh3_64_intdigest(header[:-8]))
    return [header, *payload]


def decode_header(data: bytes | bytearray | memoryview) -> ChunkHeader:
    """Parse and check a header (magic, header hash, version); raises CorruptChunkError."""
    if len(data) < HEADER.size:
        raise CorruptChunkError("truncated header")
    magic, version, dtype_code, _reserved, *fields, header_hash = HEADER.unpack_from(data)
    if magic != MAGIC or xxhash.xxh3_64_intdigest(bytes(data[: HEADER.size - 8])) != header_hash:
        raise CorruptChunkError("bad magic or header hash")
    return ChunkHeader(version, dtype_code, *fields)


def check_header(header: ChunkHeader, file_bytes: int, identity: StoreIdentity, span: ChunkSpan) -> None:
    """Check a header against the span that refers to it and the file's size."""
    expected = (
        FORMAT_VERSION,
        _DTYPE_CODES[identity.dtype],
        identity.num_layers,
        identity.num_kv_heads,
        identity.head_dim,
        span.start,
        span.num_tokens,
    )
    if tuple(header[:7]) != expected or header.identity_digest != identity_digest(identity):
        raise CorruptChunkError(f"chunk {span.key}: header {tuple(header[:7])}, expected {expected}")
    if header.key != bytes.fromhex(span.key):
        raise CorruptChunkError(f"chunk file holds key {header.key.hex()}, not {span.key}")
    if file_bytes != HEADER.size + header.payload_bytes:
        raise CorruptChunkError(
            f"chunk {span.key}: {file_bytes} bytes, header says {header.payload_bytes} + header"
        )


def decode_chunk(
    data: bytearray, identity: StoreIdentity, span: ChunkSpan
) -> tuple[list[int], list[torch.Tensor]]:
    """Verify a whole chunk file against its header, its payload hash and the span that
    refers to it. Returns its token ids and per-layer KV tensors (views into `data`)."""
    header = decode_header(data)
    check_header(header, len(data), identity, span)
    payload = memoryview(data)[HEADER.size :]
    if xxhash.xxh3_128_digest(payload) != header.payload_hash:
        raise CorruptChunkError(f"chunk {span.key} fails its payload hash")
    token_bytes = 4 * span.num_tokens
    token_ids = np.frombuffer(payload[:token_bytes], dtype="<u4").tolist()
    return token_ids, list(_layer_views(data, HEADER.size + token_bytes, identity, span.num_tokens))


def _layer_views(
    data: bytearray, offset: int, identity: StoreIdentity, num_tokens: int
) -> Iterator[torch.Tensor]:
    import torch

    shape = (2, num_tokens, identity.num_kv_heads, identity.head_dim)
    layer_bytes = num_tokens * identity.bytes_per_token // identity.num_layers
    for layer in range(identity.num_layers):
        raw = torch.frombuffer(
            data, dtype=torch.uint8, count=layer_bytes, offset=offset + layer * layer_bytes
        )
        yield raw.view(identity.torch_dtype).view(shape)
