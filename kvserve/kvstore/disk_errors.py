"""DiskErrorLog: one warning per run of disk errors, not one per checkpoint.

A full disk or a directory that became read-only fails every store and every hit's
bookkeeping; the server keeps serving from RAM, and the log says so once (then at debug
level) until a write succeeds again.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger("kvserve.kvstore")


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
