"""PNG plots of the comparison runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen before pyplot loads
from matplotlib.ticker import MaxNLocator

from kvserve.bench.context_sweep import ContextPoint
from kvserve.bench.metrics import BenchMetrics
from kvserve.bench.multiturn import TurnSummary
from kvserve.bench.server_probe import ServerSample
from kvserve.bench.soak_summary import SoakSummary


def plot_serve(by_label: dict[str, BenchMetrics], path: Path, title: str) -> Path:
    """Output throughput, and p50/p99 TTFT and TPOT, one bar per server."""
    labels = list(by_label)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].bar(labels, [m.output_throughput for m in by_label.values()], color="tab:blue")
    axes[0].set_title("output throughput (tok/s)")
    for ax, name in ((axes[1], "ttft"), (axes[2], "tpot")):
        width = 0.38
        xs = range(len(labels))
        p50 = [getattr(m, f"{name}_ms").median for m in by_label.values()]
        p99 = [getattr(m, f"{name}_ms").p99 for m in by_label.values()]
        ax.bar([x - width / 2 for x in xs], p50, width, label="p50")
        ax.bar([x + width / 2 for x in xs], p99, width, label="p99")
        ax.set_xticks(list(xs), labels)
        ax.set_title(f"{name.upper()} (ms)")
        ax.legend()
    return _save(fig, path, title)


def plot_multiturn(
    by_label: dict[str, list[TurnSummary]], path: Path, title: str, restart_after: int | None
) -> Path:
    """p50 TTFT per turn (log scale), one line per server; a dashed line marks the restart."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, turns in by_label.items():
        pts = [(t.turn, t.p50_ttft_ms) for t in turns if t.p50_ttft_ms is not None]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ratios = [(t.turn, t.p50_cached_ratio) for t in turns if t.p50_cached_ratio is not None]
        if ratios:
            axes[1].plot([p[0] for p in ratios], [p[1] * 100 for p in ratios], marker="o", label=label)
    axes[0].set_yscale("log")
    axes[0].set_title("p50 TTFT per turn (ms, log)")
    axes[1].set_title("p50 cached share of the prompt (%)")
    axes[1].set_ylim(-5, 105)
    for ax in axes:
        ax.set_xlabel("turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if restart_after:
            ax.axvline(restart_after + 0.5, color="grey", linestyle="--", label="server restart")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return _save(fig, path, title)


def plot_context(by_label: dict[str, list[ContextPoint]], path: Path, title: str) -> Path:
    """Prefill tok/s of each new interval and decode tok/s at each frontier, vs context length."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, points in by_label.items():
        ok = [p for p in points if not p.error]
        axes[0].plot([p.frontier for p in ok], [p.prefill_tok_s for p in ok], marker="o", label=label)
        axes[1].plot([p.frontier for p in ok], [p.decode_tok_s for p in ok], marker="o", label=label)
    axes[0].set_title("prefill of the new interval (tok/s)")
    axes[1].set_title("decode at the frontier (tok/s)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context tokens")
        ax.legend()
    return _save(fig, path, title)


def _save(fig: plt.Figure, path: Path, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_soak(summary: SoakSummary, samples: list[ServerSample], path: Path, title: str) -> Path:
    """RSS (with the pool's touched bytes and the ceiling), descriptors and threads, KV blocks in use,
    the disk tier's files and index rows, and p50/p99 TTFT per window, over the run."""
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    procs = [(s.t_s, s.process) for s in samples if s.process is not None]
    pools = [(s.t_s, s.pool) for s in samples if s.pool is not None]
    mib = 2**20
    axes[0].plot([t for t, _ in procs], [p.rss_bytes / mib for _, p in procs], label="RSS")
    if summary.rss_idle is not None:
        touched = [(t, summary.rss_idle + p.num_touched_blocks * p.block_bytes) for t, p in pools]
        axes[0].plot(
            [t for t, _ in touched], [v / mib for _, v in touched], "--", label="idle + touched pool"
        )
    if summary.rss_ceiling is not None:
        axes[0].axhline(summary.rss_ceiling / mib, color="tab:red", linestyle=":", label="ceiling")
    axes[0].set_title("server RSS (MiB)")
    axes[1].plot([t for t, _ in procs], [p.num_fds for _, p in procs], label="open descriptors")
    axes[1].plot([t for t, _ in procs], [p.num_threads for _, p in procs], label="threads")
    axes[1].set_title("descriptors, threads")
    axes[2].plot([t for t, _ in pools], [p.num_used_blocks for _, p in pools], label="in use")
    axes[2].plot([t for t, _ in pools], [p.num_cached_blocks for _, p in pools], label="cached")
    axes[2].set_title("KV blocks")
    disks = [(s.t_s, s.disk) for s in samples if s.disk is not None]
    axes[3].plot([t for t, _ in disks], [d.num_files for _, d in disks], label="files")
    axes[3].plot([t for t, _ in disks], [d.num_checkpoint_rows for _, d in disks], label="checkpoint rows")
    axes[3].plot([t for t, _ in disks], [d.num_chunk_rows for _, d in disks], label="chunk rows")
    axes[3].set_title("disk KV tier")
    windows = [w for w in summary.ttft_windows if w.p50_ms is not None]
    axes[4].plot([w.start_s for w in windows], [w.p50_ms for w in windows], marker="o", label="p50")
    axes[4].plot([w.start_s for w in windows], [w.p99_ms for w in windows], marker="o", label="p99")
    axes[4].set_title("TTFT by start time (ms)")
    for ax in axes:
        ax.set_xlabel("seconds")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return _save(fig, path, title)
