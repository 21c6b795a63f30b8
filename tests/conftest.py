"""Suite-wide isolation: servers that tests build from `kvserve serve`'s defaults (and the CLIs they
spawn, which inherit the environment) keep their disk KV cache in a temporary directory, never in
the user's ~/.cache/kvserve/kv. Model files and the tokenizer cache stay where they are."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest


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
