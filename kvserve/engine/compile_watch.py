"""Say so when Triton compiles a kernel after the start-up warm-up, i.e. while a request waits.

A compile takes from tens of milliseconds to seconds and happens inside a step, so every request of
that step sees it as latency (measured on an H200: a fresh server's first 16-stream burst had a
p99 TTFT of ~1.3 s, and ~0.1 s once the same burst had run once). `warmup.py` compiles the variants
it knows of; this names any it missed, once each, with the kernel, its specialization and the time
it took, so the next warm-up can cover it. It uses Triton's own compile hooks (`triton.knobs.runtime`:
`jit_cache_hook` runs before a compile, `jit_post_compile_hook` after it), and changes nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)


class CompileWatch:
    """The two hooks, and what they saw (for logs and tests)."""

    def __init__(self) -> None:
        self.compiles: list[tuple[str, float]] = []  # (kernel, seconds), in order
        self._started = threading.local()

    def before(self, **hook: Any) -> None:
        # NOTE: a true result would tell Triton to skip the compile: this hook only takes the time.
        self._started.at = time.monotonic()

    def after(self, *, repr: str, fn: Any, **hook: Any) -> None:  # `repr`: Triton's keyword
        started = getattr(self._started, "at", None)
        seconds = 0.0 if started is None else time.monotonic() - started
        self._started.at = None
        name = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"
        self.compiles.append((name, seconds))
        logger.warning(
            "Triton compiled %s after the warm-up, inside a step (%.0f ms): %s. "
            "Requests in that step waited for it; engine/warmup.py can cover this variant.",
            name,
            1000 * seconds,
            repr,
        )


def watch_compiles() -> CompileWatch | None:
    """Install the hooks (replacing any others); None where Triton or its hooks are missing."""
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return None
    watch = CompileWatch()
    runtime.jit_cache_hook = watch.before
    runtime.jit_post_compile_hook = watch.after
    return watch
