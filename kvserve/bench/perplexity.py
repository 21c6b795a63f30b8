"""llama-perplexity's arithmetic, as plain numpy: which positions of a text are scored, and perplexity,
KL divergence and top-1 agreement from the next-token log-probabilities at those positions.

The text is cut into chunks of `ctx` tokens every `stride` tokens (llama-perplexity: `-c ctx`,
non-overlapping chunks, stride = ctx), each scored on its own with an empty KV. As llama-perplexity
does, only the second half of a chunk is scored: the distributions at positions ctx//2 .. ctx-2
predict tokens ctx//2+1 .. ctx-1, so every scored token has at least half a chunk of context
(ctx - 1 - ctx//2 predictions per chunk). NOTE: llama-perplexity also puts BOS in place of each
chunk's first token where the vocabulary adds one (`add_bos`); `chunk_plan` leaves the tokens alone,
and the caller does that substitution (`chunk_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

_ROWS_PER_BLOCK = 64  # rows of [n, vocab] log-probs widened to float64 at a time


class Chunk(NamedTuple):
    start: int  # index of the chunk's first token in the text
    num_tokens: int  # the chunk's length (ctx)
    first_scored: int  # position (within the chunk) of the first scored distribution: ctx // 2

    @property
    def num_scored(self) -> int:
        """Distributions scored: positions first_scored .. num_tokens - 2, each predicting the next."""
        return self.num_tokens - 1 - self.first_scored


def chunk_plan(num_tokens: int, ctx: int, stride: int = 0, max_chunks: int = 0) -> list[Chunk]:
    """The chunks of a `num_tokens`-token text (stride 0 = ctx; max_chunks 0 = all that fit whole)."""
    if ctx < 4:
        raise ValueError(f"the chunk context must be at least 4 tokens, got {ctx}")
    stride = stride or ctx
    if stride < 1:
        raise ValueError(f"the stride must be >= 1, got {stride}")
    starts = range(0, num_tokens - ctx + 1, stride)
    chunks = [Chunk(start, ctx, ctx // 2) for start in starts]
    if not chunks:
        raise ValueError(f"the text has {num_tokens} tokens, fewer than one chunk of {ctx}")
    return chunks[:max_chunks] if max_chunks > 0 else chunks


def chunk_tokens(token_ids: list[int], chunk: Chunk, bos_token_id: int | None) -> list[int]:
    """The chunk's tokens as the model sees them: BOS in place of the first where the model adds
    one (llama-perplexity's convention), so each chunk starts as a fresh sequence does."""
    tokens = token_ids[chunk.start : chunk.start + chunk.num_tokens]
    return tokens if bos_token_id is None else [bos_token_id, *tokens[1:]]


def scored_targets(token_ids: list[int], chunks: list[Chunk]) -> np.ndarray:
    """The token each scored distribution predicts, in scoring order [num_scored] int64."""
    targets = [
        token_ids[c.start + c.first_scored + 1 : c.start + c.num_tokens] for c in chunks
    ]  # the chunk's own tokens: BOS only ever replaces an unscored first token
    return np.asarray([t for part in targets for t in part], dtype=np.int64)


@dataclass(frozen=True)
class Scores:
    """Per scored position: the log-probability of the true next token and the argmax token."""

    target_logprobs: np.ndarray  # [num_scored] float64
    top1_ids: np.ndarray  # [num_scored] int64

    @property
    def perplexity(self) -> float:
        return math.exp(-float(self.target_logprobs.mean()))

    @property
    def perplexity_stderr(self) -> float:
        """llama-perplexity's `+/-`: the standard error of the mean NLL, carried through exp."""
        nll = -self.target_logprobs
        return self.perplexity * float(nll.std(ddof=1) / math.sqrt(len(nll))) if len(nll) > 1 else 0.0


def score(logprobs: np.ndarray, targets: np.ndarray) -> Scores:
    """`logprobs` [num_scored, vocab] log-softmax rows; `targets` [num_scored] the true next tokens."""
    rows = np.arange(len(targets))
    return Scores(logprobs[rows, targets].astype(np.float64), logprobs.argmax(axis=-1).astype(np.int64))


def kl_divergence(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(reference || other) of each row's next-token distribution [num_scored], in nats, from
    log-probabilities (llama-perplexity's direction: the base model's distribution weighs)."""
    assert reference.shape == other.shape, (reference.shape, other.shape)
    out = np.empty(len(reference), dtype=np.float64)
    for begin in range(0, len(reference), _ROWS_PER_BLOCK):
        ref = reference[begin : begin + _ROWS_PER_BLOCK].astype(np.float64)
        cur = other[begin : begin + _ROWS_PER_BLOCK].astype(np.float64)
        out[begin : begin + len(ref)] = (np.exp(ref) * (ref - cur)).sum(axis=-1)
    return np.maximum(out, 0.0)  # rounding can give -1e-17 for identical distributions


class Comparison(NamedTuple):
    """A configuration against the reference, over the same scored positions."""

    kl_mean: float
    kl_p99: float
    kl_max: float
    top1_agreement: float  # share of positions whose argmax token is the reference's
    ppl_ratio: float  # perplexity / the reference's perplexity


def compare(
    reference: Scores, reference_logprobs: np.ndarray, scores: Scores, logprobs: np.ndarray
) -> Comparison:
    kl = kl_divergence(reference_logprobs, logprobs)
    return Comparison(
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        kl_max=float(kl.max()),
        top1_agreement=float((reference.top1_ids == scores.top1_ids).mean()),
        ppl_ratio=scores.perplexity / reference.perplexity,
    )
