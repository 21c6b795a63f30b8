"""Headless Chromium through Playwright for the web console's tests: the system Chromium (never a
downloaded browser), a fresh profile, the flags a root user in a container needs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_browser() -> Any:
    """The Playwright sync API, or a module-level skip that says what is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e .[test])"
    )
    if CHROMIUM is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run does)", allow_module_level=True)
    return sync_api


@contextmanager
def browser_page(
    sync_api: Any, viewport: tuple[int, int] = (1400, 900), **context_options: Any
) -> Iterator[Any]:
    """A page of a fresh Chromium profile; `context_options` go to Playwright's context (e.g.
    `bypass_csp=True`)."""
    with (
        sync_api.sync_playwright() as playwright,
        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": viewport[0], "height": viewport[1]},
            **context_options,
        )
        try:
            yield context.new_page()
        finally:
            context.close()
