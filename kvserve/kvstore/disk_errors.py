"""DiskErrorLog: one warning per run of disk errors, not one per checkpoint.

A full disk or a directory that became read-only fails every store and every hit's
bookkeeping; the server keeps serving from RAM, and the log says so once (then at debug
level) until a write succeeds again.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

logger = logging.getLogger("kvserve.kvstore")

# Room kept free beyond a checkpoint's files: the index's WAL and the manifests' rewrites need some.
FREE_SPACE_MARGIN_BYTES = 1 << 20


def check_free_space(directory: Path, num_bytes: int) -> None:
    """Raise ENOSPC when the filesystem cannot take `num_bytes` more (plus a margin): a store on a
    full disk is skipped before it writes anything, instead of failing partway through its chunks."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize  # what an unprivileged writer may still use
    if free < num_bytes + FREE_SPACE_MARGIN_BYTES:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {free / 2**20:.1f} MiB free for {num_bytes / 2**20:.1f} MiB",
        )


class DiskErrorLog:
    def __init__(self, directory: Path | str) -> None:
        self.directory = directory
        self.num_failures = 0  # in total, for stats
        self._num_in_run = 0

    def failed(self, what: str, error: OSError) -> None:
        self.num_failures += 1
        self._num_in_run += 1
        if self._num_in_run == 1:
            logger.warning(
                "kvstore: cannot write to %s (%s): %s skipped; serving continues, further "
                "disk errors are logged at debug level until a write succeeds",
                self.directory,
                error,
                what,
            )
        else:
            logger.debug("kvstore: %s skipped: %s", what, error)

    def succeeded(self) -> None:
        if self._num_in_run:
            logger.info("kvstore: writes to %s succeed again (%d skipped)", self.directory, self._num_in_run)
            self._num_in_run = 0
