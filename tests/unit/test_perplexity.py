"""llama-perplexity's arithmetic (kvserve/bench/perplexity.py) and its logits file format, on numbers
small enough to work out by hand."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

from kvserve.bench.llama_perplexity import read_logits_file
from kvserve.bench.perplexity import (
    Chunk,
    chunk_plan,
    chunk_tokens,
    compare,
    kl_divergence,
    score,
    scored_targets,
)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_chunks_are_llama_perplexitys_non_overlapping_halves() -> None:
    chunks = chunk_plan(num_tokens=21, ctx=8)
    assert chunks == [Chunk(0, 8, 4), Chunk(8, 8, 4)]  # 21 tokens: two whole chunks, the rest unused
    assert [c.num_scored for c in chunks] == [3, 3]  # positions 4, 5, 6 predict tokens 5, 6, 7
    assert chunk_plan(21, 8, stride=4) == [Chunk(0, 8, 4), Chunk(4, 8, 4), Chunk(8, 8, 4), Chunk(12, 8, 4)]
    assert chunk_plan(21, 8, max_chunks=1) == [Chunk(0, 8, 4)]
    assert chunk_plan(9, 9) == [Chunk(0, 9, 4)]  # odd: ctx // 2 context, 4 scored
    with pytest.raises(ValueError, match="fewer than one chunk"):
        chunk_plan(7, 8)


def test_targets_are_the_tokens_after_each_scored_position_and_bos_replaces_only_the_first() -> None:
    token_ids = list(range(100, 121))
    chunks = chunk_plan(len(token_ids), 8)
    assert scored_targets(token_ids, chunks).tolist() == [105, 106, 107, 113, 114, 115]
    assert chunk_tokens(token_ids, chunks[1], bos_token_id=1) == [1, *range(109, 116)]
    assert chunk_tokens(token_ids, chunks[1], bos_token_id=None) == list(range(108, 116))


def test_perplexity_matches_a_hand_computed_case() -> None:
    # Two scored positions over a 3-token vocabulary; the true tokens are 0 then 2.
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, math.log(2.0)]])
    logprobs = _log_softmax(logits).astype(np.float32)
    scores = score(logprobs, np.array([0, 2]))
    p0 = math.exp(2) / (math.exp(2) + math.exp(1) + 1)
    p1 = 2 / (1 + 1 + 2)
    assert scores.perplexity == pytest.approx(math.exp(-(math.log(p0) + math.log(p1)) / 2), rel=1e-6)
    assert scores.top1_ids.tolist() == [0, 2]
    nll = [-math.log(p0), -math.log(p1)]
    stderr = scores.perplexity * np.std(nll, ddof=1) / math.sqrt(2)
    assert scores.perplexity_stderr == pytest.approx(stderr, rel=1e-5)


def test_kl_is_zero_against_itself_and_matches_the_definition_otherwise() -> None:
    rng = np.random.default_rng(0)
    reference = _log_softmax(rng.normal(size=(130, 50))).astype(np.float32)  # more rows than a block
    assert kl_divergence(reference, reference).tolist() == [0.0] * 130
    other = _log_softmax(reference + rng.normal(scale=0.1, size=reference.shape)).astype(np.float32)
    kl = kl_divergence(reference, other)
    p, q = np.exp(reference[7].astype(np.float64)), np.exp(other[7].astype(np.float64))
    assert kl[7] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-5)
    assert (kl > 0).all() and np.isfinite(kl).all()


def test_compare_reports_agreement_and_the_perplexity_ratio() -> None:
    reference = _log_softmax(np.array([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0], [0.0, 3.0]])).astype(np.float32)
    flipped = reference.copy()
    flipped[3] = reference[2]  # the last position now prefers the other token
    targets = np.array([0, 1, 0, 1])
    same = compare(score(reference, targets), reference, score(reference, targets), reference)
    assert same.kl_mean == same.kl_p99 == 0.0 and same.top1_agreement == 1.0 and same.ppl_ratio == 1.0
    other = compare(score(reference, targets), reference, score(flipped, targets), flipped)
    assert other.top1_agreement == 0.75 and other.ppl_ratio > 1.0
    assert other.kl_max == pytest.approx(other.kl_mean * 4) and other.kl_max > 0


def test_a_llama_perplexity_logits_file_decodes_to_its_log_probs(tmp_path: Path) -> None:
    """The layout tools/perplexity/perplexity.cpp writes: header, tokens, then per scored position
    (scale, min log-prob) as two floats and the log-probs quantized to uint16, padded to even."""
    ctx, vocab, num_chunks = 4, 3, 2  # ctx 4: positions 2 (one per chunk) scored
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    expected = _log_softmax(np.array([[1.0, 0.0, -2.0], [0.5, 0.25, 0.0]]))
    body = b""
    for row in expected:
        low = row.min()
        scale = (row.max() - low) / 65535
        quantized = np.rint((row - low) / scale).astype(np.uint16)
        body += struct.pack("<ff", scale, low) + quantized.tobytes() + b"\0\0"  # vocab 3 pads to 4
    header = (
        b"_logits_" + struct.pack("<iii", ctx, vocab, num_chunks) + struct.pack(f"<{len(tokens)}i", *tokens)
    )
    (tmp_path / "base.kld").write_bytes(header + body)
    decoded = read_logits_file(tmp_path / "base.kld")
    assert decoded.ctx == ctx and decoded.token_ids.tolist() == tokens
    np.testing.assert_allclose(decoded.logprobs, expected, atol=1e-4)
