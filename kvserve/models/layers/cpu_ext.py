"""The AVX2 C++ kernels for CPU decode (csrc/): low-bit linears and one-token paged attention.

Built with torch's cpp_extension at first use (about a minute, once per source version: torch
caches the build under ~/.cache/torch_extensions and rebuilds when a source changes), never at
import. `load()` is None where the CPU lacks the instructions or the build fails; callers then
keep their torch paths. `KVSERVE_CPU_KERNELS=0` turns the kernels off (for A/B measurements).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
_SOURCES = ("bindings.cpp", "lowbit_linear.cpp", "decode_attention.cpp")
ENABLED = os.environ.get("KVSERVE_CPU_KERNELS", "1") != "0"


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            return next((set(line.split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


@functools.cache
def load() -> Any | None:
    """The compiled extension module, or None (logged once) where it cannot run here."""
    if not ENABLED:
        return None
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in cpu_flags()]
    if missing:
        logger.info("CPU decode kernels off: the CPU lacks %s", ", ".join(missing))
        return None
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    csrc = Path(__file__).with_name("csrc")
    try:
        return cpp_extension.load(
            name="kvserve_cpu_kernels",
            sources=[str(csrc / name) for name in _SOURCES],
            extra_include_paths=[str(csrc)],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c"],
            verbose=False,
        )
    except Exception:  # a missing compiler or headers must not take the engine down
        logger.exception("building the CPU decode kernels failed; using the torch paths")
        return None


def _put_ninja_on_path() -> None:
    """torch builds with the `ninja` on PATH; without a system one, use the PyPI wheel's binary.

    The wheel (a dependency) puts it in the venv's bin folder, which is on PATH only when the venv is
    activated, and `make serve` runs `.venv/bin/kvserve` without activating it.
    """
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
