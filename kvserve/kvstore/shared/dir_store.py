"""DirObjectStore: the shared tier in a directory that every replica mounts (NFS, CephFS, a local
disk for replicas of one host).

No locks and no database: SQLite's locking is not reliable over NFS, and flock is not either on
every client. Each object is written to a private temp file, fsynced, then hard-linked to its final
name: link(2) fails when the name exists (atomically, on NFS too), so the first writer wins and a
reader never sees a partial file. A filesystem without hard links falls back to rename, which for
content-addressed objects replaces bytes with the same bytes.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

from kvserve.kvstore.atomic_file import FILE_MODE, TEMP_MARKER, ensure_private_dir, fsync_dir, is_temp_file
from kvserve.kvstore.shared.object_store import ObjectInfo, ObjectStoreError

_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


class DirObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            ensure_private_dir(root)
        except OSError as error:
            raise ObjectStoreError(f"cannot use shared KV directory {root}: {error}") from error
        self._counter = 0

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        assert key and not key.startswith("/") and ".." not in key.split("/"), key
        return self.root / key

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.exists():
            return False
        ensure_private_dir(path.parent)
        self._counter += 1
        # The host name keeps two hosts' temp files apart when they share a pid.
        temp = path.with_name(f"{path.name}{TEMP_MARKER}{os.uname().nodename}.{os.getpid()}.{self._counter}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return self._publish(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    def _publish(self, temp: Path, path: Path) -> bool:
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in _NO_LINKS:
                raise
            os.replace(temp, path)  # same key, same bytes: replacing is harmless
        fsync_dir(path.parent)
        return True

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Keys are <model>/<kind>/<name>: walk only below the directory the prefix names.
        base_key = prefix.rpartition("/")[0]
        start = self.root / base_key if base_key else self.root
        for directory, _subdirs, names in os.walk(start):
            base = Path(directory).relative_to(self.root).as_posix()
            for name in names:
                key = name if base == "." else f"{base}/{name}"
                if not key.startswith(prefix) or is_temp_file(Path(name)):
                    continue
                try:
                    stat = os.stat(os.path.join(directory, name))
                except FileNotFoundError:  # deleted by a sweeper meanwhile
                    continue
                yield ObjectInfo(key, stat.st_size, stat.st_mtime)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def temp_files(self, older_than_s: float) -> list[Path]:
        """Temp files of writes that died (a replica killed mid-write), for the sweeper."""
        now = time.time()
        found = []
        for directory, _subdirs, names in os.walk(self.root):
            for name in names:
                path = Path(directory) / name
                if is_temp_file(path):
                    try:
                        if now - path.stat().st_mtime > older_than_s:
                            found.append(path)
                    except FileNotFoundError:
                        continue
        return found
