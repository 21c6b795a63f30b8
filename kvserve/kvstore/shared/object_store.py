"""ObjectStore: the few operations the shared KV tier needs from a shared directory or a bucket.

Every object is immutable once visible: `put_if_absent` writes it whole or not at all and never
replaces an existing one, so a reader sees either nothing or complete bytes, and two replicas
writing the same content-addressed chunk at once leave one copy. Keys are relative POSIX paths
(`<model>/chunks/<key>.kvc`, `keys.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Protocol


class ObjectInfo(NamedTuple):
    key: str
    size: int
    modified: float  # seconds since the epoch (the store's clock: an S3 server's, a file's mtime)


class ObjectStoreError(OSError):
    """The store could not be reached or refused an operation (network, permissions, full)."""


class ObjectStore(Protocol):
    @property
    def url(self) -> str:
        """Where it is, for logs and `kvserve kv` (a path, or s3://bucket/prefix)."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store `data` under `key` unless an object is there; True if this call wrote it."""
        ...

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None if there is none."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every complete object whose key starts with `prefix` (never a write in progress)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (no error if it is gone already)."""
        ...
