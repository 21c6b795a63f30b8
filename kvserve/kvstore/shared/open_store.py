"""Opening the shared tier's object store from what the user gave: a directory or an s3:// URL."""

from __future__ import annotations

from pathlib import Path

from kvserve.kvstore.shared.object_store import ObjectStore


def is_s3_url(location: str) -> bool:
    return location.startswith("s3://")


def open_object_store(location: str, endpoint_url: str | None = None) -> ObjectStore:
    """A DirObjectStore for a path, an S3ObjectStore (checked reachable) for s3://bucket/prefix.
    Raises ObjectStoreError (an OSError) when it cannot be used, ValueError for a bad URL."""
    if is_s3_url(location):
        from kvserve.kvstore.shared.s3_store import S3ObjectStore

        store = S3ObjectStore(location, endpoint_url)
        store.check()
        return store
    if "://" in location:
        raise ValueError(f"shared KV tier: expected a directory or s3://bucket/prefix, got {location!r}")
    from kvserve.kvstore.shared.dir_store import DirObjectStore

    return DirObjectStore(Path(location).expanduser())
