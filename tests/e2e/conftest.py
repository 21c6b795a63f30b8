"""Fixtures shared by the end-to-end test files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.client_fixtures import serve_model


@pytest.fixture(scope="module")
def smollm2_16k_url() -> Iterator[str]:
    """The default model served in this process with `--ctx 16384` (what `make serve` runs): one per
    test file, so the two long client fixtures, a file each, prefill on two test workers at once."""
    with serve_model("smollm2", 16384) as url:
        yield url
