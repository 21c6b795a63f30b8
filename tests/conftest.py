"""Suite-wide isolation: servers that tests build from `kvserve serve`'s defaults (and the CLIs they
spawn, which inherit the environment) keep their disk KV cache in a temporary directory, never in
the user's ~/.cache/kvserve/kv. Model files and the tokenizer cache stay where they are.

Under pytest-xdist (`make test` runs one worker per core, up to four) each worker and the servers it
spawns get an equal share of the cores as torch threads: two processes that each run an OpenMP team
as wide as the machine make every parallel region wait for a descheduled thread, and element-wise
ops then take milliseconds instead of microseconds."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the servers and CLIs the tests start
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests first, then the other real-model tests, then the rest (a stable sort, so files
    stay together): xdist hands out whole files in this order, and the minutes-long files started
    last would leave one worker running them alone while the other has finished."""
    items.sort(
        key=lambda item: (
            0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("model") else 2
        )
    )


@pytest.fixture(scope="session", autouse=True)
def _isolated_kv_cache_dir() -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix="kvserve-test-cache-") as directory:
        previous = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = directory
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = previous
