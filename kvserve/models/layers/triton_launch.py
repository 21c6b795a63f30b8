"""How the Triton kernels run: under the interpreter in CPU tests, with programmatic dependent
launch (PDL) on Hopper and later GPUs.

Why PDL: a one-token decode step of a 1B model is ~130 small kernels in one CUDA graph, and each one
normally starts only after the previous one has fully drained: at ~5-10 us of work per kernel,
the ~1-3 us of launch gap, ramp-up and tail per kernel is a large share of the step. A kernel
launched with PDL may start while its predecessor still runs: its programs become resident,
issue the loads that do not depend on the predecessor (a GEMV's first weight tile), then block in
`gdc_wait` until the predecessor has finished and its writes are visible. A kernel lets its
successor start by calling `gdc_launch_dependents`; every kernel here calls it right after its
wait, so its successor can start once its last programs are running. (Calling it before the wait,
so that a chain of latency-bound kernels becomes resident together, measured no faster on the
H200: docs/benchmarks/history.md.)

Rules each PDL kernel keeps: nothing written by an earlier kernel is read, and nothing is written,
before `gdc_wait` (a predecessor may still read what it would overwrite). Kernels that are not PDL
(torch, cuBLAS) never signal early, so PDL kernels after them start as usual. `KVSERVE_PDL=0` turns
it off (for A/B measurements); GPUs before compute capability 9 lack the instructions.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvserve.env import switches


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4
    return bool(knobs and knobs.runtime.interpret)


# Under TRITON_INTERPRET=1 (CPU tests) the kernels run their dots in fp32: the interpreter's
# bf16 tl.dot returns garbage. PDL is off there.
INTERPRETING = _interpreting()

# Read at every launch (not only at import), so an A/B script can flip it between engines.
PDL_ENABLED = switches().is_pdl_enabled


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def use_pdl(x: torch.Tensor) -> bool:
    """Launch the kernels that work on `x` with PDL (their USE_PDL constexpr and `launch_pdl`)."""
    return PDL_ENABLED and x.is_cuda and not INTERPRETING and _device_supports(x.device.index or 0)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With PDL: wait for the predecessor kernel, then let the successor start. Everything a kernel
    does before this may read only what no earlier kernel writes."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
