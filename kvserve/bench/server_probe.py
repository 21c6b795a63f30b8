"""What a long run samples of the server it loads: the process tree's RSS, descriptors and threads
(psutil, when the process is known: launched here or `--pid`), the KV block pool (the console's
`/kvserve/v1/cache` route) and the disk tier's files and SQLite index rows (when its directory is
known). Each probe answers None for what it cannot see, so a remote `--url` run still reports the rest.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil


@dataclass(frozen=True)
class ProcessSample:
    rss_bytes: int  # the whole process tree (front ends and an engine process included)
    num_fds: int
    num_threads: int


@dataclass(frozen=True)
class PoolSample:
    num_blocks: int
    num_used_blocks: int  # held by requests in flight (cached-but-free blocks are not in use)
    num_cached_blocks: int
    num_touched_blocks: int  # ever handed out: on CPU, the resident part of the pool (0: not reported)
    block_bytes: int  # KV bytes of one block (0: not reported)


@dataclass(frozen=True)
class DiskSample:
    num_files: int
    num_bytes: int
    num_checkpoint_rows: int
    num_chunk_rows: int


@dataclass(frozen=True)
class ServerSample:
    t_s: float  # seconds since the run began
    process: ProcessSample | None
    pool: PoolSample | None
    disk: DiskSample | None


def sample_process(pid: int) -> ProcessSample | None:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    rss = fds = threads = 0
    for proc in procs:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
        except psutil.Error:
            continue  # a child that just exited
    return ProcessSample(rss, fds, threads)


async def sample_pool(http: httpx.AsyncClient, base_url: str) -> PoolSample | None:
    try:
        response = await http.get(base_url.rstrip("/") + "/kvserve/v1/cache", timeout=30.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    pool = response.json().get("pool")
    if not pool:
        return None
    return PoolSample(
        pool["num_blocks"],
        pool["num_used_blocks"],
        pool["num_cached_blocks"],
        pool.get("num_touched_blocks", 0),
        pool.get("block_bytes", 0),
    )


def sample_disk(cache_dir: Path) -> DiskSample | None:
    """Files and bytes under the KV directory, and the rows of each model's index."""
    if not cache_dir.is_dir():
        return None
    num_files = num_bytes = checkpoints = chunks = 0
    for path in cache_dir.rglob("*"):
        try:
            if path.is_file():
                num_files += 1
                num_bytes += path.stat().st_size
        except OSError:
            continue  # a temp file renamed or an evicted chunk removed while we walked
    for index in cache_dir.glob("*/index.sqlite"):
        rows = _index_rows(index)
        checkpoints += rows[0]
        chunks += rows[1]
    return DiskSample(num_files, num_bytes, checkpoints, chunks)


def _index_rows(index: Path) -> tuple[int, int]:
    # Read-only, beside the server's writer (WAL allows it); a busy or missing table reads as 0.
    try:
        with sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=5.0) as db:
            checkpoints = db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
            chunks = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    except sqlite3.Error:
        return 0, 0
    return int(checkpoints), int(chunks)


class ServerProbe:
    def __init__(self, base_url: str, pid: int | None, cache_dir: Path | None) -> None:
        self.base_url, self.pid, self.cache_dir = base_url, pid, cache_dir
        self.began = time.monotonic()

    async def sample(self, http: httpx.AsyncClient) -> ServerSample:
        t_s = time.monotonic() - self.began
        # Off the event loop: /proc reads and the directory walk would stall the clients' streams.
        process = None if self.pid is None else await asyncio.to_thread(sample_process, self.pid)
        disk = None if self.cache_dir is None else await asyncio.to_thread(sample_disk, self.cache_dir)
        return ServerSample(t_s, process, await sample_pool(http, self.base_url), disk)
