"""What the agent has seen of each file, so `write` can refuse to clobber a file that changed
(on disk, by someone else) since the agent last read or wrote it."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

# Above this size the fingerprint is stat-only: hashing a huge file on every read would be slow.
MAX_HASHED_BYTES = 16 << 20


@dataclass(frozen=True)
class Fingerprint:
    mtime_ns: int
    size: int
    inode: int
    sha256: str | None

    @classmethod
    def of(cls, path: Path) -> Fingerprint | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        digest = None
        if st.st_size <= MAX_HASHED_BYTES:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return cls(st.st_mtime_ns, st.st_size, st.st_ino, digest)

    def same_content(self, other: Fingerprint | None) -> bool:
        if other is None:
            return False
        if self.sha256 is not None and other.sha256 is not None:
            return self.sha256 == other.sha256
        return (self.mtime_ns, self.size, self.inode) == (other.mtime_ns, other.size, other.inode)


class FileLedger:
    def __init__(self) -> None:
        self._seen: dict[Path, Fingerprint] = {}

    def record(self, path: Path) -> None:
        fingerprint = Fingerprint.of(path)
        if fingerprint is not None:
            self._seen[path] = fingerprint

    def check_unchanged(self, path: Path) -> str | None:
        """None when `path` may be overwritten; else why not (a message for the model)."""
        current = Fingerprint.of(path)
        if current is None:
            return None  # a new file (or one deleted since): nothing to clobber
        seen = self._seen.get(path)
        if seen is None:
            return "the file exists and you have not read it; read it first"
        if not seen.same_content(current):
            return "the file changed on disk since you last read it; read it again"
        return None
