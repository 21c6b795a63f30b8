"""Where the disk tier lives by default, and the lock that keeps `kvserve kv` from editing a
directory while a server uses it.

A server holds a shared lock on `<dir>/lock` for as long as its store is open (several may);
`kvserve kv rm|prune|verify --fix` takes it exclusively without waiting, and refuses to run
when a server holds it: an editor and a server would each delete what the other is writing.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from kvserve.kvstore.atomic_file import FILE_MODE

logger = logging.getLogger(__name__)

LOCK_NAME = "lock"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/kvserve/kv`, else `~/.cache/kvserve/kv`: the server's and `kvserve kv`'s default."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvserve" / "kv"


class CacheDirBusyError(OSError):
    """The directory is locked by a running server (or by another `kvserve kv` edit)."""


class DirLock:
    """An advisory flock on `<directory>/lock`; released by `release()` or process exit."""

    def __init__(self, directory: Path, *, exclusive: bool) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            if exclusive:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                fcntl.flock(self._fd, fcntl.LOCK_SH)  # waits out a short `kvserve kv` edit
        except BlockingIOError as error:
            self.release()
            raise CacheDirBusyError(f"{directory} is in use by a running kvserve server") from error
        except BaseException:
            self.release()
            raise

    @classmethod
    def shared_if_possible(cls, directory: Path) -> DirLock | None:
        """A server's shared lock; None where the lock file cannot be created (read-only dir):
        the store then serves what it can read, and nothing can edit the directory anyway."""
        try:
            return cls(directory, exclusive=False)
        except OSError as error:
            logger.warning("kvstore: cannot lock %s (%s); continuing without the lock", directory, error)
            return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
