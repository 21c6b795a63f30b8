"""Terminal tables (rich) and CSV files for the benchmark results."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path

from rich.table import Table

from kvserve.bench.context_sweep import ContextPoint
from kvserve.bench.metrics import BenchMetrics
from kvserve.bench.multiturn import TurnResult, TurnSummary


def write_csv(path: Path, rows: Iterable[Mapping[str, object]]) -> Path:
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    return path


def _cell(value: object) -> object:
    return f"{value:.4f}" if isinstance(value, float) else value


def serve_table(by_label: dict[str, BenchMetrics], title: str) -> Table:
    labels = list(by_label)
    table = Table("metric", *labels, title=title)
    first = next(iter(by_label.values()), None)
    if first is None:
        return table
    rows = [(k, [m.flat()[k] for m in by_label.values()]) for k in first.flat()]
    for key, values in rows:
        table.add_row(key, *(_fmt(v) for v in values))
    if len(labels) >= 2:
        base = by_label[labels[-1]].output_throughput
        for label in labels[:-1]:
            ratio = by_label[label].output_throughput / base if base else float("nan")
            table.add_row(
                f"output throughput {label} / {labels[-1]}", *["" for _ in labels[:-1]], f"{ratio:.2f}x"
            )
    return table


def multiturn_table(by_label: dict[str, list[TurnSummary]], title: str) -> Table:
    table = Table(
        "turn",
        *(f"{label} p50 TTFT ms" for label in by_label),
        *(f"{label} cached" for label in by_label),
        title=title,
    )
    turns = sorted({t.turn for summaries in by_label.values() for t in summaries})
    for turn in turns:
        cells_ttft, cells_cached, restart, image = [], [], False, False
        for summaries in by_label.values():
            row = next((t for t in summaries if t.turn == turn), None)
            restart = restart or bool(row and row.is_after_restart)
            image = image or bool(row and row.has_image)
            cells_ttft.append(_fmt(row.p50_ttft_ms) if row else "-")
            ratio = row.p50_cached_ratio if row else None
            cells_cached.append(f"{ratio:.0%}" if ratio is not None else "-")
        notes = " (image)" * image + " (after restart)" * restart
        table.add_row(f"{turn}{notes}", *cells_ttft, *cells_cached)
    return table


def multiturn_rows(label: str, results: list[TurnResult]) -> list[dict[str, object]]:
    return [
        {
            "server": label,
            "agent": r.agent,
            "turn": r.turn,
            "after_restart": r.is_after_restart,
            "images": r.num_images,
            "ok": r.result.is_success,
            "ttft_ms": r.result.ttft * 1000.0,
            "e2el_ms": r.result.latency * 1000.0,
            "prompt_tokens": r.result.prompt_len,
            "cached_tokens": r.result.cached_tokens,
            "output_tokens": r.result.output_len,
            "error": r.result.error,
        }
        for r in results
    ]


def context_table(by_label: dict[str, list[ContextPoint]], title: str) -> Table:
    table = Table(
        "frontier",
        *(f"{label} prefill tok/s" for label in by_label),
        *(f"{label} decode tok/s" for label in by_label),
        title=title,
    )
    frontiers = sorted({p.frontier for points in by_label.values() for p in points})
    for frontier in frontiers:
        found = [next((p for p in points if p.frontier == frontier), None) for points in by_label.values()]
        prefill = [
            _fmt(p.prefill_tok_s) + ("*" if p.is_prefill_assumed else "") if p and not p.error else "-"
            for p in found
        ]
        decode = [_fmt(p.decode_tok_s) if p and not p.error else "-" for p in found]
        table.add_row(str(frontier), *prefill, *decode)
    if any(p.is_prefill_assumed and not p.error for points in by_label.values() for p in points):
        table.caption = "* no cached count reported: prefilled tokens assumed = the new interval"
    return table


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)
