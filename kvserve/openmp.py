"""Keep a server's helper threads out of torch's OpenMP thread teams.

Why: libgomp (torch's OpenMP on Linux) spins a team's idle workers for a while before they sleep,
so that the next parallel region starts at once, but only while it manages no more threads than
the machine has CPUs; past that it spins ~100 times and sleeps, and every parallel region then
waits for futex wake-ups. Each thread that runs a parallel region gets a team of its own that
lives as long as the thread: a server that loaded its model on the main thread and decoded on an
engine thread held two teams, and on 2 cores a SmolLM2 decode step took 16.6 ms instead of 10.0
(~210 regions per step; docs/benchmarks/history.md). So the engine is built on the thread that runs it
(`AsyncEngineClient(build=...)`), and threads that may run large torch ops (the disk tier's writer)
call `confine_to_one_thread()`.
"""

from __future__ import annotations

import ctypes
import os


def confine_to_one_thread() -> bool:
    """Run this thread's torch parallel regions on itself alone (OpenMP's per-thread thread count;
    other threads keep theirs). False where torch's libgomp is not loaded (nothing to confine).

    Call it before the thread's work: torch sets a thread's OpenMP thread count at its first
    parallel region, once per library that inlines at::parallel_for (libtorch here, first; an
    extension's first region on a thread would set it back)."""
    import torch

    torch.get_num_threads()  # torch's per-thread OpenMP set-up first, or it would undo the line below
    try:
        libgomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)  # the copy torch loaded, if any
    except OSError:
        return False
    libgomp.omp_set_num_threads(1)
    return True
