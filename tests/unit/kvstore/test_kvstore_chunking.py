"""Chunk cutting and keys: content addressing by chain hash, tails, lookup walk."""

from __future__ import annotations

from kvstore_helpers import FINGERPRINT, random_tokens

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import ChunkSpan
from kvserve.kvstore.chunking import chunk_spans, format_key, longest_stored_run, prefix_key


def spans_of(tokens: list[int], fingerprint: str = FINGERPRINT) -> list[ChunkSpan]:
    return chunk_spans(tokens, compute_block_hashes(tokens, 4, fingerprint), 4, 16, fingerprint)


def test_chunks_cover_the_prefix_and_full_chunks_are_keyed_by_the_chain_hash() -> None:
    tokens = random_tokens(50, 0)
    hashes = compute_block_hashes(tokens, 4, FINGERPRINT)
    spans = spans_of(tokens)
    assert [(s.start, s.end) for s in spans] == [(0, 16), (16, 32), (32, 48), (48, 50)]
    assert [s.key for s in spans[:3]] == [format_key(hashes[i]) for i in (3, 7, 11)]


def test_equal_prefixes_share_keys_and_any_difference_changes_every_later_key() -> None:
    tokens = random_tokens(64, 1)
    branch = tokens[:20] + random_tokens(44, 2)
    assert spans_of(tokens)[0] == spans_of(branch)[0]
    assert all(a.key != b.key for a, b in zip(spans_of(tokens)[1:], spans_of(branch)[1:], strict=True))
    assert spans_of(tokens, "another-model")[0].key != spans_of(tokens)[0].key


def test_tail_keys_name_the_exact_prefix() -> None:
    tokens = random_tokens(40, 3)
    hashes = compute_block_hashes(tokens, 4, FINGERPRINT)
    tail = prefix_key(38, tokens, hashes, 4, FINGERPRINT)
    assert tail == spans_of(tokens[:38])[-1].key
    assert tail != prefix_key(37, tokens, hashes, 4, FINGERPRINT)
    assert tail != spans_of(tokens[:37] + [tokens[37] + 1])[-1].key
    assert prefix_key(36, tokens, hashes, 4, FINGERPRINT) == format_key(hashes[8])
    assert prefix_key(3, tokens, hashes, 4, FINGERPRINT) != prefix_key(3, tokens, hashes, 4, "x")


def test_longest_stored_run_walks_full_chunks_then_the_longest_partial() -> None:
    tokens = random_tokens(80, 4)
    hashes = compute_block_hashes(tokens, 4, FINGERPRINT)
    stored_spans = set(spans_of(tokens[:64])[:2] + [spans_of(tokens[:44])[-1], spans_of(tokens[:40])[-1]])

    def stored(candidates: list[ChunkSpan]) -> set[ChunkSpan]:
        return stored_spans & set(candidates)

    run = longest_stored_run(hashes, 4, 16, stored)
    assert [(s.start, s.end) for s in run] == [(0, 16), (16, 32), (32, 44)]
    assert longest_stored_run(hashes, 4, 16, lambda candidates: set()) == []
