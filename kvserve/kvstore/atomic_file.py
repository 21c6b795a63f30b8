"""Crash-safe file primitives: private directories, atomic replace, leftover temp cleanup.

A reader never sees a partial file: data goes to `<name>.tmp.<pid>.<n>`, is fsynced, then
renamed over the final name, and the directory is fsynced so the rename survives a crash.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
TEMP_MARKER = ".tmp."

_temp_counter = itertools.count()


def ensure_private_dir(path: Path) -> None:
    """Create `path` (and parents) as 0700: KV reveals prompt contents.

    NOTE: an existing directory keeps its mode; a user pointing the cache at a shared
    directory chose it, and chmod-ing e.g. their home directory would be a surprise.
    """
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[bytes | memoryview], *, sync_dir: bool = True) -> int:
    """Write `chunks` to `path` atomically with mode 0600; returns the bytes written.

    `sync_dir=False` lets a caller writing many files fsync their directory once at the end.
    """
    temp = path.with_name(f"{path.name}{TEMP_MARKER}{os.getpid()}.{next(_temp_counter)}")
    num_bytes = 0
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                num_bytes += f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return num_bytes


def is_temp_file(path: Path) -> bool:
    return TEMP_MARKER in path.name


def remove_temp_files(directory: Path) -> int:
    """Delete leftovers of interrupted writes (never complete files); returns how many."""
    removed = 0
    for path in directory.iterdir():
        if path.is_file() and is_temp_file(path):
            path.unlink(missing_ok=True)
            removed += 1
    return removed
