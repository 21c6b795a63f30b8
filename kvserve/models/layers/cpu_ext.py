"""The C++ CPU kernels (csrc/): low-bit linears, one-token paged attention, and prompt attention
(AVX2; AVX-512 and AMX through target attributes and oneDNN's micro-kernels where the CPU has them).

Built with torch's cpp_extension at first use (one to a few minutes, once per machine and source
version, in a folder named by the sources' hash under ~/.cache/torch_extensions; `make setup` does it
ahead of the first server start), never at import. `load()` is None where the CPU lacks the instructions or the build fails; callers then
keep their torch paths. `KVSERVE_CPU_KERNELS=0` turns the kernels off (for A/B measurements).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvserve.env import switches

logger = logging.getLogger(__name__)

REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
_SOURCES = (
    "bindings.cpp",
    "lowbit_linear.cpp",
    "lowbit_gemm.cpp",
    "decode_attention.cpp",
    "decode_stack.cpp",
    "prefill_attention.cpp",
)
ENABLED = switches().is_cpu_kernels_enabled  # an A/B script flips it, then clears load()'s cache


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            return next((set(line.split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def has_fast_bf16() -> bool:
    """AMX or AVX512-BF16: oneDNN's bf16 matmuls beat fp32 there; elsewhere bf16 is emulated."""
    flags = cpu_flags()
    return "amx_bf16" in flags or "avx512_bf16" in flags


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
    try:
        name, src, build = _build_folders(Path(__file__).with_name("csrc"), compile_key())
        with _build_lock(build):
            if not (build / f"{name}.so").exists():
                logger.warning("compiling the CPU kernels in %s (once per installation: 1-3 minutes)", build)
            return cpp_extension.load(
                name=name,
                sources=[str(src / file) for file in _SOURCES],
                extra_include_paths=[str(src)],
                extra_cflags=list(_CFLAGS),
                extra_ldflags=list(_LDFLAGS),
                build_directory=str(build),
                verbose=False,
            )
    except Exception:  # a missing compiler or headers must not take the engine down
        logger.exception("building the CPU decode kernels failed; using the torch paths")
        return None


# -fopenmp: at::parallel_for is OpenMP in torch's CPU builds, and without the flag its header
# compiles to a serial loop: until round 2's sixth session every kernel here ran on one thread
# whatever --threads said. The extension binds to the libgomp torch has already loaded (same
# soname), so torch.set_num_threads governs both.
_CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp")
_LDFLAGS = ("-fopenmp",)


def compile_key() -> tuple[str, ...]:
    """Everything besides the sources that goes into the compile and link commands torch writes: the
    compiler torch picks (its own `CXX` lookup), our flags, torch's version and C++ ABI, torch's and
    Python's include paths (inside each virtualenv) and the Python ABI of the module's file name."""
    import sysconfig

    import torch
    from torch.utils.cpp_extension import include_paths

    python_abi = sysconfig.get_config_var("EXT_SUFFIX") or ""
    return (
        os.environ.get("CXX", "c++"),
        *_CFLAGS,
        *_LDFLAGS,
        torch.__version__,
        f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *include_paths(),
        sysconfig.get_paths()["include"],
        python_abi,
    )


def _build_folders(csrc: Path, key: tuple[str, ...]) -> tuple[str, Path, Path]:
    """(module name, source folder, build folder), named by the sources' content and the `key`
    (`compile_key()`: everything else in the compile command).

    torch's own cache is keyed by the extension's name, and ninja rebuilds whenever a compile command
    changes, which the absolute source paths are part of: two checkouts (a CI clone, a worktree)
    took turns recompiling the same code for minutes each. The sources are therefore copied into a
    folder named by their hash, and compiled from there. The include paths (torch's headers and
    Python's, inside each virtualenv) are in the command too: two installations on one machine
    would otherwise rebuild each other's kernels at every start, so each gets its own folder.
    """
    files = sorted(p for p in csrc.iterdir() if p.suffix in (".cpp", ".h"))
    digest = hashlib.sha256("\0".join(key).encode())
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    name = f"kvserve_cpu_kernels_{digest.hexdigest()[:12]}"
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions") / name
    src, build = root / "src", root / "build"
    if not all((src / path.name).exists() for path in files):
        staging = Path(tempfile.mkdtemp(prefix="src-", dir=_made(root)))
        for path in files:
            shutil.copyfile(path, staging / path.name)
        try:
            staging.rename(src)  # atomic: a concurrent start either sees all files or none
        except OSError:  # another process got there first with the same content
            shutil.rmtree(staging, ignore_errors=True)
    return name, src, _made(build)


@contextlib.contextmanager
def _build_lock(build: Path) -> Iterator[None]:
    """Hold an flock on the build folder while torch builds or loads in it.

    torch's own lock is a plain file (`build/lock`) that a process killed mid-build (a server stopped
    during its first start, a test's start deadline) leaves behind, and every later start then waits
    on it forever. The kernel releases an flock when its holder dies, and every build here runs under
    this one, so a `lock` file found while holding it is such a leftover and is removed.
    """
    with open(build.parent / "build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (build / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


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


if __name__ == "__main__":
    # `make setup` builds the kernels here, so that the first `kvserve serve` (and every test's
    # server, whose start-up has a deadline) finds them compiled instead of spending minutes on it.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print("CPU decode kernels:", "built" if load() is not None else "not available on this CPU (torch paths)")
