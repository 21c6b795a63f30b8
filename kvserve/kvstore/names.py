"""The names of a cache directory's files: a checkpoint id is the SHA1 of its text (40 hex digits),
a chunk key a 128-bit chain hash (32). Every path is built from a name checked here, so no id, from
a manifest on disk or from a caller, can point a read, write or delete outside the directory."""

from __future__ import annotations

import re

_CHECKPOINT_ID = re.compile(r"[0-9a-f]{40}")
_CHUNK_KEY = re.compile(r"[0-9a-f]{32}")


class UnsafeNameError(ValueError):
    """A name that is no checkpoint id or chunk key (`../x`, `a/b`, ...): never made a path."""


def is_checkpoint_id(name: str) -> bool:
    return _CHECKPOINT_ID.fullmatch(name) is not None


def is_chunk_key(name: str) -> bool:
    return _CHUNK_KEY.fullmatch(name) is not None


def checked_checkpoint_id(name: str) -> str:
    if not is_checkpoint_id(name):
        raise UnsafeNameError(f"not a checkpoint id: {name!r}")
    return name


def checked_chunk_key(name: str) -> str:
    if not is_chunk_key(name):
        raise UnsafeNameError(f"not a chunk key: {name!r}")
    return name
