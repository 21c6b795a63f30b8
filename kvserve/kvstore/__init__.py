"""Disk tier of the KV cache: checkpoints (exact token prefixes with their KV) stored as
manifests over content-addressed chunks, so a prefix shared by many conversations is stored
once; a derived SQLite index; a scored eviction policy and save-trigger policy (both pure);
and a background writer. Never imports the engine: the engine hands it tensors and hashes.
"""

from kvserve.kvstore.cache_dir import CacheDirBusyError, default_cache_dir
from kvserve.kvstore.checkpoint import (
    ANCHOR_REASONS,
    SAVE_REASONS,
    Checkpoint,
    CheckpointMeta,
    ChunkRun,
    ChunkSpan,
    LoadedKV,
    SaveReason,
    SaveResult,
    StoreIdentity,
    StoreStats,
    TextKey,
)
from kvserve.kvstore.checkpoint_store import CheckpointStore, ChunkProvider, ChunkUnavailableError
from kvserve.kvstore.chunk_store import ChunkStore
from kvserve.kvstore.eviction import EvictionPolicy
from kvserve.kvstore.save_policy import (
    SavePolicy,
    chat_anchor_pos,
    cold_cut,
    cold_store_len,
    continued_frontier,
)
from kvserve.kvstore.writer import CheckpointWriter, SaveJob, WriterStats

__all__ = [
    "ANCHOR_REASONS",
    "SAVE_REASONS",
    "CacheDirBusyError",
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointStore",
    "CheckpointWriter",
    "ChunkProvider",
    "ChunkRun",
    "ChunkSpan",
    "ChunkStore",
    "ChunkUnavailableError",
    "EvictionPolicy",
    "LoadedKV",
    "SaveJob",
    "SavePolicy",
    "SaveReason",
    "SaveResult",
    "StoreIdentity",
    "StoreStats",
    "TextKey",
    "WriterStats",
    "chat_anchor_pos",
    "cold_cut",
    "cold_store_len",
    "continued_frontier",
    "default_cache_dir",
]
