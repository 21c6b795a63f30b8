"""Disk full or a directory turned read-only: stores are skipped with one warning, loads and
the writer keep working, nothing half-written stays behind, and writing resumes after."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from kvstore_helpers import Provider, kv_for, model_dir, open_store, random_tokens, save, text_of

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore import atomic_file, disk_errors
from kvserve.kvstore.checkpoint import CheckpointMeta, TextKey
from kvserve.kvstore.writer import CheckpointWriter, SaveJob


class DiskFull:
    """Makes the atomic writer's fsync fail with ENOSPC while `full` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = True
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(atomic_file.os, "fsync", fsync)


def leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if atomic_file.is_temp_file(p)]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_full_disk_skips_stores_with_one_warning_and_loads_keep_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path)
    stored = random_tokens(40, 0)
    save(store, stored)
    disk = DiskFull(monkeypatch)
    caplog.set_level(logging.DEBUG, logger="kvserve.kvstore")
    results = [save(store, random_tokens(40, seed)) for seed in (1, 2, 3)]
    assert [r.status for r in results] == ["failed"] * 3
    assert store.load(TextKey.of(text_of(stored)).sha1) is not None  # hit bookkeeping fails quietly
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "No space left" in warned[0] and "serving continues" in warned[0]
    assert store.stats().num_checkpoints == 1 and store.stats().num_disk_errors == 4
    assert leftovers(tmp_path) == [] and len(list((model_dir(tmp_path) / "chunks").iterdir())) == 3
    disk.full = False
    assert save(store, random_tokens(40, 1)).status == "stored"
    assert any("succeed again" in r.getMessage() for r in caplog.records)
    disk.full = True
    assert save(store, random_tokens(40, 4)).status == "failed"
    assert len(warnings_of(caplog)) == 2  # a new run of errors warns again


def test_the_writer_counts_failed_stores_and_keeps_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    identity = store.identity
    disk = DiskFull(monkeypatch)
    writer = CheckpointWriter(store)

    def job(seed: int) -> SaveJob:
        tokens = random_tokens(40, seed)
        meta = CheckpointMeta.new(identity, text_of(tokens), 40, "continued")
        hashes = compute_block_hashes(tokens, identity.block_size, identity.fingerprint)
        return SaveJob(meta, tokens, hashes, Provider(kv_for(tokens, identity)))

    writer.submit(job(0))
    writer.submit(job(1))
    writer.flush()
    disk.full = False
    writer.submit(job(2))
    writer.close()
    assert (writer.stats.num_failed, writer.stats.num_saved) == (2, 1)
    assert store.stats().num_checkpoints == 1


def test_a_directory_made_read_only_skips_stores_and_still_serves_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path)
    stored = random_tokens(40, 5)
    save(store, stored)
    for sub in ("chunks", "checkpoints"):
        os.chmod(model_dir(tmp_path) / sub, 0o500)
    try:
        if os.access(model_dir(tmp_path) / "chunks", os.W_OK):
            pytest.skip("running as root: permissions cannot make a directory read-only")
        caplog.set_level(logging.WARNING)
        assert [save(store, random_tokens(40, s)).status for s in (6, 7)] == ["failed", "failed"]
        assert store.load(TextKey.of(text_of(stored)).sha1) is not None
        assert len(warnings_of(caplog)) == 1
    finally:
        for sub in ("chunks", "checkpoints"):
            os.chmod(model_dir(tmp_path) / sub, 0o700)


def test_a_read_only_filesystem_skips_stores_even_for_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path)
    stored = random_tokens(40, 8)
    save(store, stored)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):  # EROFS binds root too, unlike chmod
        if flags & os.O_CREAT and str(path).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(atomic_file.os, "open", read_only_open)
    caplog.set_level(logging.WARNING)
    assert [save(store, random_tokens(40, s)).status for s in (9, 10)] == ["failed", "failed"]
    assert store.load(TextKey.of(text_of(stored)).sha1) is not None
    assert len(warnings_of(caplog)) == 1 and "Read-only" in warnings_of(caplog)[0]
    assert leftovers(tmp_path) == []


def test_a_store_that_the_filesystem_cannot_take_is_skipped_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """statvfs says too little is free: nothing is written (no temp file, no chunk), one warning;
    once space returns the next store goes through."""
    store = open_store(tmp_path)
    real_statvfs = os.statvfs
    free_blocks = {"n": 3}

    class Stats:
        def __init__(self, path: Path) -> None:
            real = real_statvfs(path)
            self.f_frsize = real.f_frsize
            self.f_bavail = real.f_bavail if free_blocks["n"] is None else free_blocks["n"]

    monkeypatch.setattr(disk_errors.os, "statvfs", Stats)
    caplog.set_level(logging.INFO, logger="kvserve.kvstore")
    assert [save(store, random_tokens(40, seed)).status for seed in (1, 2)] == ["failed", "failed"]
    assert leftovers(tmp_path) == [] and list((model_dir(tmp_path) / "chunks").iterdir()) == []
    warned = warnings_of(caplog)
    assert len(warned) == 1 and "MiB free for" in warned[0], warned
    free_blocks["n"] = None
    assert save(store, random_tokens(40, 3)).status == "stored"
    assert any("succeed again" in r.getMessage() for r in caplog.records)
