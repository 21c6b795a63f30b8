"""Shared helpers for the disk-tier tests: a tiny KV layout (2 layers, 2 heads, head_dim 4,
blocks of 4 tokens, chunks of 16 tokens) so every test runs in milliseconds on CPU."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore import layout
from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan, SaveReason, SaveResult, StoreIdentity
from kvserve.kvstore.checkpoint_store import CheckpointStore

BLOCK_SIZE = 4
CHUNK_TOKENS = 16
FINGERPRINT = "test-model:bfloat16:none"


def make_identity(dtype: str = "bfloat16", fingerprint: str = FINGERPRINT) -> StoreIdentity:
    return StoreIdentity(fingerprint, dtype, num_layers=2, num_kv_heads=2, head_dim=4, block_size=BLOCK_SIZE)


def model_dir(root: Path, identity: StoreIdentity | None = None) -> Path:
    """Where a store opened on `root` keeps `identity`'s files (its per-model subdirectory)."""
    return layout.model_dir(root, identity or make_identity())


def random_tokens(num_tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50000) for _ in range(num_tokens)]


def kv_for(token_ids: Sequence[int], identity: StoreIdentity) -> list[torch.Tensor]:
    """Deterministic KV that depends only on (token, position): shared prefixes share KV."""
    tokens = torch.tensor(token_ids, dtype=torch.float64)[:, None, None]
    positions = torch.arange(len(token_ids), dtype=torch.float64)[:, None, None]
    heads = torch.arange(identity.num_kv_heads, dtype=torch.float64)[None, :, None]
    dims = torch.arange(identity.head_dim, dtype=torch.float64)[None, None, :]
    layers = []
    for layer in range(identity.num_layers):
        k = torch.sin(tokens * 0.37 + positions * 0.11 + heads * 0.5 + dims * 0.01 + layer)
        v = torch.cos(tokens * 0.13 + positions * 0.07 + heads * 0.3 + dims * 0.02 + layer) * math.pi
        layers.append(torch.stack([k, v]).to(identity.torch_dtype))  # [2, num_tokens, heads, head_dim]
    return layers


@dataclass
class Provider:
    """Serves chunk slices of a full KV and records which chunks were asked for."""

    kv: list[torch.Tensor]
    calls: list[ChunkSpan] = field(default_factory=list)

    def __call__(self, span: ChunkSpan) -> list[torch.Tensor]:
        self.calls.append(span)
        return [layer[:, span.start : span.end] for layer in self.kv]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def text_of(token_ids: Sequence[int]) -> str:
    """A stand-in detokenizer: distinct tokens give distinct, prefix-preserving text."""
    return "".join(f"<{t}>" for t in token_ids)


def save(
    store: CheckpointStore,
    token_ids: Sequence[int],
    reason: SaveReason = "cold",
    provider: Provider | None = None,
    now: float | None = None,
) -> SaveResult:
    identity = store.identity
    meta = CheckpointMeta.new(identity, text_of(token_ids), len(token_ids), reason, now=now or store._clock())
    hashes = compute_block_hashes(token_ids, identity.block_size, identity.fingerprint)
    return store.save(meta, token_ids, hashes, provider or Provider(kv_for(token_ids, identity)))


def open_store(
    directory: Path,
    identity: StoreIdentity | None = None,
    budget_bytes: int = 1 << 30,
    clock: Clock | None = None,
) -> CheckpointStore:
    return CheckpointStore(
        directory,
        identity or make_identity(),
        budget_bytes,
        chunk_tokens=CHUNK_TOKENS,
        clock=clock or Clock(),
    )


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """Raw bit pattern, so comparisons are bit-exact (NaN and -0.0 included)."""
    return tensor.contiguous().view(torch.int16 if tensor.element_size() == 2 else torch.int32)
