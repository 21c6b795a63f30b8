"""Chunk and manifest file formats: bit-exact round trips, every corruption detected."""

from __future__ import annotations

import struct

import pytest
import torch
from kvstore_helpers import bits, make_identity, random_tokens

from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan
from kvserve.kvstore.chunk_format import (
    HEADER,
    CorruptChunkError,
    chunk_file_size,
    decode_chunk,
    encode_chunk,
)
from kvserve.kvstore.manifest import (
    CorruptManifestError,
    IncompatibleManifestError,
    decode_manifest,
    encode_manifest,
)

SPAN = ChunkSpan("ab" * 16, 16, 28)


def random_layers(dtype: torch.dtype, num_tokens: int) -> list[torch.Tensor]:
    # Random bit patterns cover every value the dtype has: NaNs, infinities, -0.0, subnormals.
    itype = torch.int16 if torch.empty((), dtype=dtype).element_size() == 2 else torch.int32
    info = torch.iinfo(itype)
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randint(info.min, info.max, (2, num_tokens, 2, 4), dtype=itype, generator=gen).view(dtype)
        for _ in range(2)
    ]


def encoded(identity, span=SPAN, layers=None) -> bytearray:
    layers = layers if layers is not None else random_layers(identity.torch_dtype, span.num_tokens)
    return bytearray(b"".join(encode_chunk(identity, span, list(range(span.num_tokens)), layers)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_chunk_round_trip_is_bit_exact(dtype: str) -> None:
    identity = make_identity(dtype)
    layers = random_layers(identity.torch_dtype, SPAN.num_tokens)
    data = encoded(identity, layers=layers)
    assert len(data) == chunk_file_size(identity, SPAN.num_tokens)
    token_ids, decoded = decode_chunk(data, identity, SPAN)
    assert token_ids == list(range(SPAN.num_tokens))
    for original, loaded in zip(layers, decoded, strict=True):
        assert loaded.dtype == original.dtype and loaded.shape == (2, 12, 2, 4)
        assert torch.equal(bits(loaded), bits(original))


def test_non_contiguous_gpu_style_slices_are_accepted() -> None:
    identity = make_identity("float32")
    full = random_layers(torch.float32, 40)
    layers = [layer[:, SPAN.start : SPAN.end] for layer in full]  # a view into a bigger cache
    _, decoded = decode_chunk(encoded(identity, layers=layers), identity, SPAN)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(layers, decoded, strict=True))


@pytest.mark.parametrize("offset", [0, 5, HEADER.size - 1, HEADER.size + 3, HEADER.size + 60, -1])
def test_any_flipped_byte_is_detected(offset: int) -> None:
    identity = make_identity()
    data = encoded(identity)
    data[offset] ^= 0x40
    with pytest.raises(CorruptChunkError):
        decode_chunk(data, identity, SPAN)


def test_truncated_chunk_and_mismatched_span_or_identity_are_rejected() -> None:
    identity = make_identity()
    data = encoded(identity)
    with pytest.raises(CorruptChunkError):
        decode_chunk(data[:-1], identity, SPAN)
    with pytest.raises(CorruptChunkError):
        decode_chunk(data, identity, ChunkSpan("cd" * 16, SPAN.start, SPAN.end))
    with pytest.raises(CorruptChunkError):
        decode_chunk(data, make_identity(fingerprint="other-model"), SPAN)


def test_wrong_shape_or_dtype_is_refused_at_encode() -> None:
    identity = make_identity()
    with pytest.raises(ValueError):
        encode_chunk(identity, SPAN, list(range(12)), random_layers(torch.float32, 12))
    with pytest.raises(ValueError):
        encode_chunk(identity, SPAN, list(range(12)), random_layers(torch.bfloat16, 11))


def test_manifest_round_trip_and_corruption() -> None:
    identity = make_identity()
    token_ids = random_tokens(40, 0)
    meta = CheckpointMeta.new(identity, "some text", 40, "continued", now=123.0)
    chunks = [ChunkSpan("00" * 16, 0, 16), ChunkSpan("11" * 16, 16, 32), ChunkSpan("22" * 16, 32, 40)]
    data = encode_manifest(meta, token_ids, chunks)
    manifest = decode_manifest(data)
    assert manifest.meta == meta and manifest.token_ids == token_ids and manifest.chunks == chunks
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    with pytest.raises(CorruptManifestError):
        decode_manifest(bytes(flipped))
    with pytest.raises(CorruptManifestError):
        decode_manifest(data[:-4])
    other_version = data[:4] + struct.pack("<H", 99) + data[6:]
    with pytest.raises(IncompatibleManifestError):
        decode_manifest(other_version)
