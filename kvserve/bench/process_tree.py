"""The processes whose command line matches, and everything they started (psutil's view of the
host's process table), without this process and its parents, which may name the same thing."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil


def process_tree(is_root: Callable[[list[str]], bool]) -> set[int]:
    """PIDs of the processes whose argv satisfies `is_root`, and of all their descendants."""
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for proc in psutil.process_iter(["ppid", "cmdline"]):
        cmdline, ppid = proc.info["cmdline"], proc.info["ppid"]
        if ppid is None:
            continue  # ended meanwhile, or not ours to read
        parents[proc.pid] = ppid
        if cmdline and is_root(cmdline):
            roots.add(proc.pid)
    mine: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        pid = parents.get(pid, 0)
    found = roots - mine
    while more := {pid for pid, parent in parents.items() if parent in found} - found - mine:
        found |= more
    return found
