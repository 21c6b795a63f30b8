"""A byte-level llguidance tokenizer (the FakeEngine's), so grammar tests need no model."""

from __future__ import annotations

import random

import torch

from kvserve.grammar.compiler import GrammarCompiler, tokenizer_factory
from kvserve.grammar.constraint import GrammarConstraint
from tests.api.fake_engine import EOS_ID, ByteTokenizer

TOKENIZER = ByteTokenizer()
VOCAB = len(TOKENIZER)


def byte_compiler() -> GrammarCompiler:
    return GrammarCompiler(tokenizer_factory(TOKENIZER, VOCAB, (EOS_ID,)))


def accepts(constraint: GrammarConstraint, text: str) -> bool:
    """Whether the whole of `text` is a complete sentence of the constraint's grammar."""
    ok = all(constraint.accept_token(t) for t in TOKENIZER.encode(text))
    return ok and constraint.accept_token(EOS_ID)


def allowed_ids(constraint: GrammarConstraint) -> list[int]:
    words = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    constraint.fill_bitmask(words.data_ptr(), words.numel() * 4)
    return [i for i in range(VOCAB) if (int(words[i // 32]) >> (i % 32)) & 1]


def random_walk(constraint: GrammarConstraint, seed: int, max_steps: int = 600) -> str:
    """Sample uniformly among the allowed tokens until the grammar ends: what any model could write."""
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(max_steps):
        token_id = rng.choice(allowed_ids(constraint))
        if token_id == EOS_ID:
            break
        assert constraint.accept_token(token_id), constraint.error
        out.append(token_id)
        if constraint.is_finished:
            break
    return TOKENIZER.decode(out)
