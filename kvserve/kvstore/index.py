"""SQLite index (WAL) over the store's files: checkpoint metadata, chunk sizes, and which
checkpoint uses which chunk (the chunk reference counts).

NOTE: the files are the source of truth. This index is a cache of them that the store
rebuilds whenever it is missing, damaged, from another schema or out of step with the files.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kvserve.kvstore.atomic_file import FILE_MODE
from kvserve.kvstore.checkpoint import Checkpoint, CheckpointMeta, ChunkSpan, StoreIdentity, TextKey

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE checkpoints (
    checkpoint_id TEXT PRIMARY KEY, text_bytes INTEGER NOT NULL, num_tokens INTEGER NOT NULL,
    reason TEXT NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, hits INTEGER NOT NULL,
    manifest_bytes INTEGER NOT NULL);
CREATE INDEX checkpoints_by_text ON checkpoints (text_bytes);
CREATE TABLE chunks (chunk_key TEXT PRIMARY KEY, start INTEGER NOT NULL, end INTEGER NOT NULL,
    num_bytes INTEGER NOT NULL);
CREATE TABLE checkpoint_chunks (checkpoint_id TEXT NOT NULL, position INTEGER NOT NULL,
    chunk_key TEXT NOT NULL, PRIMARY KEY (checkpoint_id, position));
CREATE INDEX checkpoint_chunks_by_key ON checkpoint_chunks (chunk_key);
"""
_TABLES = ("meta", "checkpoints", "chunks", "checkpoint_chunks")


class IndexDamagedError(RuntimeError):
    """The index cannot be trusted (unreadable, wrong schema, other identity): rebuild it."""


class IndexWriteError(OSError):
    """A write to the index failed (disk full, read-only directory): an I/O error like any other."""


class CheckpointIndex:
    def __init__(self, path: Path, identity: StoreIdentity, identity_tag: str) -> None:
        """Open an existing index, raising IndexDamagedError if it is unusable."""
        self.identity = identity
        self._identity_tag = identity_tag
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))  # WAL/shm files inherit 0600
        # NOTE: the store serializes every use of the connection with its own lock.
        self._db = sqlite3.connect(path, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # the files are durable; the index is derivable
            self._check()
        except (sqlite3.DatabaseError, IndexDamagedError) as error:
            self._db.close()
            raise IndexDamagedError(str(error)) from error

    def _check(self) -> None:
        if self._db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise IndexDamagedError("quick_check failed")
        names = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if names != set(_TABLES):
            raise IndexDamagedError(f"tables {sorted(names)}")
        meta = dict(self._db.execute("SELECT key, value FROM meta"))
        if meta != {"schema": SCHEMA_VERSION, "identity": self._identity_tag}:
            raise IndexDamagedError(f"schema/identity {meta}")

    @classmethod
    def create(cls, path: Path, identity: StoreIdentity, identity_tag: str) -> CheckpointIndex:
        """A fresh, empty index at `path` (any previous index files are deleted)."""
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
        db = sqlite3.connect(path)
        with db:
            db.executescript(_SCHEMA)
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)", [("schema", SCHEMA_VERSION), ("identity", identity_tag)]
            )
        db.close()
        return cls(path, identity, identity_tag)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        try:
            with self._db:
                yield
        except sqlite3.OperationalError as error:  # SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR
            raise IndexWriteError(f"index write failed: {error}") from error

    def add(
        self,
        meta: CheckpointMeta,
        chunks: Sequence[ChunkSpan],
        manifest_bytes: int,
        chunk_bytes: dict[str, int],
    ) -> None:
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    meta.checkpoint_id,
                    meta.text.num_bytes,
                    meta.num_tokens,
                    meta.reason,
                    meta.created,
                    meta.last_used,
                    meta.hits,
                    manifest_bytes,
                ),
            )
            self._db.executemany(
                "INSERT OR IGNORE INTO chunks VALUES (?, ?, ?, ?)",
                [(s.key, s.start, s.end, chunk_bytes[s.key]) for s in chunks],
            )
            self._db.execute("DELETE FROM checkpoint_chunks WHERE checkpoint_id = ?", (meta.checkpoint_id,))
            self._db.executemany(
                "INSERT INTO checkpoint_chunks VALUES (?, ?, ?)",
                [(meta.checkpoint_id, i, s.key) for i, s in enumerate(chunks)],
            )

    def remove(self, checkpoint_id: str) -> list[str]:
        """Drop a checkpoint; returns the keys of chunks no checkpoint uses any more."""
        with self._transaction():
            keys = [
                k
                for (k,) in self._db.execute(
                    "SELECT chunk_key FROM checkpoint_chunks WHERE checkpoint_id = ?", (checkpoint_id,)
                )
            ]
            self._db.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (checkpoint_id,))
            self._db.execute("DELETE FROM checkpoint_chunks WHERE checkpoint_id = ?", (checkpoint_id,))
            orphans = [
                k
                for k in set(keys)
                if not self._db.execute(
                    "SELECT 1 FROM checkpoint_chunks WHERE chunk_key = ? LIMIT 1", (k,)
                ).fetchone()
            ]
            self._db.executemany("DELETE FROM chunks WHERE chunk_key = ?", [(k,) for k in orphans])
        return sorted(orphans)

    def update_usage(self, checkpoint_id: str, last_used: float, hits: int, manifest_bytes: int) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE checkpoints SET last_used = ?, hits = ?, manifest_bytes = ? WHERE checkpoint_id = ?",
                (last_used, hits, manifest_bytes, checkpoint_id),
            )

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        row = self._db.execute(
            "SELECT * FROM checkpoints WHERE checkpoint_id = ?", (checkpoint_id,)
        ).fetchone()
        return None if row is None else self._checkpoint(row)

    def all(self) -> list[Checkpoint]:
        return [self._checkpoint(row) for row in self._db.execute("SELECT * FROM checkpoints")]

    def checkpoint_ids(self) -> set[str]:
        return {i for (i,) in self._db.execute("SELECT checkpoint_id FROM checkpoints")}

    def text_candidates(self, max_text_bytes: int, max_tokens: int | None = None) -> list[TextKey]:
        """Keys of checkpoints whose text could prefix a text of `max_text_bytes` bytes."""
        rows = self._db.execute(
            "SELECT checkpoint_id, text_bytes FROM checkpoints WHERE text_bytes <= ? AND num_tokens <= ?",
            (max_text_bytes, 2**62 if max_tokens is None else max_tokens),
        )
        return [TextKey(*row) for row in rows]

    def stored_keys(self, keys: Iterable[str]) -> set[str]:
        keys = list(keys)
        marks = ",".join("?" * len(keys))
        return {
            k for (k,) in self._db.execute(f"SELECT chunk_key FROM chunks WHERE chunk_key IN ({marks})", keys)
        }

    def chunk_bytes(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT chunk_key, num_bytes FROM chunks"))

    def stored_spans(self, spans: Iterable[ChunkSpan]) -> set[ChunkSpan]:
        by_key = {span.key: span for span in spans}
        marks = ",".join("?" * len(by_key))
        rows = self._db.execute(
            f"SELECT chunk_key, start, end FROM chunks WHERE chunk_key IN ({marks})", list(by_key)
        )
        return {span for span in (ChunkSpan(*row) for row in rows) if by_key.get(span.key) == span}

    def users_of(self, chunk_key: str) -> list[str]:
        rows = self._db.execute(
            "SELECT DISTINCT checkpoint_id FROM checkpoint_chunks WHERE chunk_key = ?", (chunk_key,)
        )
        return sorted(i for (i,) in rows)

    def total_bytes(self) -> int:
        manifests = self._db.execute("SELECT COALESCE(SUM(manifest_bytes), 0) FROM checkpoints").fetchone()[0]
        chunks = self._db.execute("SELECT COALESCE(SUM(num_bytes), 0) FROM chunks").fetchone()[0]
        return int(manifests + chunks)

    def _checkpoint(self, row: tuple) -> Checkpoint:
        checkpoint_id, text_bytes, num_tokens, reason, created, last_used, hits, manifest_bytes = row
        spans = tuple(
            ChunkSpan(*r)
            for r in self._db.execute(
                "SELECT c.chunk_key, c.start, c.end FROM checkpoint_chunks cc JOIN chunks c USING (chunk_key) "
                "WHERE cc.checkpoint_id = ? ORDER BY cc.position",
                (checkpoint_id,),
            )
        )
        chunk_total = self._db.execute(
            "SELECT COALESCE(SUM(c.num_bytes), 0) FROM checkpoint_chunks cc JOIN chunks c USING (chunk_key) "
            "WHERE cc.checkpoint_id = ?",
            (checkpoint_id,),
        ).fetchone()[0]
        meta = CheckpointMeta(
            self.identity, TextKey(checkpoint_id, text_bytes), num_tokens, reason, created, last_used, hits
        )
        return Checkpoint(meta, spans, manifest_bytes, manifest_bytes + int(chunk_total))
