"""The typed records of the disk tier: what a checkpoint is, how its KV is cut into chunks,
and what save/lookup/load report back. Plain data, no I/O."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    import torch

SaveReason = Literal["cold", "continued", "evict", "shutdown", "agent_system", "agent_session"]
SAVE_REASONS: tuple[SaveReason, ...] = (
    "cold",
    "continued",
    "evict",
    "shutdown",
    "agent_system",
    "agent_session",
)
# Task-boundary checkpoints and the agent's explicit saves (the reference's anchors): the most
# likely to be reused, so eviction favours them.
ANCHOR_REASONS: frozenset[SaveReason] = frozenset(
    {"cold", "evict", "shutdown", "agent_system", "agent_session"}
)
# Saved again and again as one sequence grows: an entry the incoming checkpoint extends is
# redundant (its chunks are shared), so eviction takes it first.
SUPERSEDED_REASONS: frozenset[SaveReason] = frozenset({"continued", "agent_session"})

# The KV dtypes the disk tier stores (the pool's own: config.CacheConfig.kv_dtype), by name, with
# their element size in bytes. Names rather than torch dtypes: this module stays importable without
# torch (`kvserve kv` reads it).
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class StoreIdentity:
    """What makes stored KV reusable: the same model/cache key and the same KV layout.

    `fingerprint` is the engine's cache key (model fingerprint, dtype, weight quant); it is
    also the extra key of the block chain hashes, so chunk keys differ across models anyway.
    An entry whose identity differs from the store's is incompatible and gets removed.
    """

    fingerprint: str
    dtype: str  # a key of DTYPE_BYTES
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unsupported KV dtype {self.dtype!r}")
        assert min(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size) > 0, self

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)  # a key of DTYPE_BYTES (checked in __post_init__)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token across all layers (K and V)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]


class TextKey(NamedTuple):
    """SHA1 (hex) and UTF-8 byte length of a rendered text: a checkpoint's lookup key."""

    sha1: str
    num_bytes: int

    @classmethod
    def of(cls, text: str) -> TextKey:
        data = text.encode()
        return cls(hashlib.sha1(data).hexdigest(), len(data))


@dataclass(frozen=True)
class CheckpointMeta:
    """One checkpoint: an exact token prefix whose rendered text hashes to `text.sha1`.

    The checkpoint id is the text SHA1, as in the reference: one checkpoint per rendered text.
    """

    identity: StoreIdentity
    text: TextKey
    num_tokens: int
    reason: SaveReason
    created: float
    last_used: float
    hits: int = 0

    @classmethod
    def new(
        cls,
        identity: StoreIdentity,
        text: str | TextKey,
        num_tokens: int,
        reason: SaveReason,
        now: float | None = None,
    ) -> CheckpointMeta:
        now = time.time() if now is None else now
        key = text if isinstance(text, TextKey) else TextKey.of(text)
        return cls(identity, key, num_tokens, reason, created=now, last_used=now)

    @property
    def checkpoint_id(self) -> str:
        return self.text.sha1

    def used(self, now: float, *, hit: bool) -> CheckpointMeta:
        return replace(self, last_used=now, hits=self.hits + int(hit))


class ChunkSpan(NamedTuple):
    """Tokens [start, end) of a checkpoint, stored as one content-addressed chunk file."""

    key: str  # 32 hex digits: the chain hash naming the whole prefix up to `end`
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Checkpoint:
    """A stored checkpoint as the index knows it: metadata plus its chunk manifest."""

    meta: CheckpointMeta
    chunks: tuple[ChunkSpan, ...]
    manifest_bytes: int
    num_bytes: int  # manifest + all its chunks, shared ones included

    @property
    def checkpoint_id(self) -> str:
        return self.meta.checkpoint_id


@dataclass(frozen=True)
class ChunkRun:
    """The longest run of stored chunks that prefixes a request (lookup by block hashes)."""

    chunks: tuple[ChunkSpan, ...]
    checkpoint_ids: tuple[str, ...]  # checkpoints holding the run's last chunk

    @property
    def num_tokens(self) -> int:
        return self.chunks[-1].end if self.chunks else 0


@dataclass(frozen=True)
class LoadedKV:
    """KV read back from disk, verified. `kv[layer]` is [2, num_tokens, num_kv_heads, head_dim]."""

    token_ids: tuple[int, ...]
    kv: list[torch.Tensor] = field(repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StoreStats:
    num_checkpoints: int
    num_chunks: int
    total_bytes: int
    num_loads: int
    num_evictions: int
    num_corrupt_removed: int
    num_disk_errors: int = 0  # stores and bookkeeping writes skipped for a disk error


# failed: a disk error (full, read-only); the store logged it and keeps serving.
SaveStatus = Literal["stored", "exists", "too_large", "no_room", "incompatible", "unavailable", "failed"]


@dataclass(frozen=True)
class SaveResult:
    status: SaveStatus
    checkpoint_id: str
    num_new_chunks: int = 0
    num_new_bytes: int = 0
    evicted_ids: tuple[str, ...] = ()
