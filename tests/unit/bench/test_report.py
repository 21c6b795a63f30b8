"""CSV, tables and plots from synthetic results (files written, content checked)."""

from __future__ import annotations

import csv
from pathlib import Path

from rich.console import Console

from kvserve.bench import plots, report
from kvserve.bench.context_sweep import point
from kvserve.bench.metrics import RequestResult, compute_metrics
from kvserve.bench.multiturn import TurnResult, summarize_turns


def _turns(ttfts: list[float], cached: int | None) -> list[TurnResult]:
    return [
        TurnResult(
            0, i + 1, i >= 2, RequestResult(True, 100, 10, ttft=t, latency=t + 1, cached_tokens=cached)
        )
        for i, t in enumerate(ttfts)
    ]


def test_multiturn_csv_table_and_plot(tmp_path: Path) -> None:
    results = {
        "kvserve-disk": _turns([5.0, 0.2, 0.3, 0.2], 90),
        "llama-server": _turns([6.0, 0.5, 6.0, 0.5], None),
    }
    rows = [row for label, rs in results.items() for row in report.multiturn_rows(label, rs)]
    path = report.write_csv(tmp_path / "mt.csv", rows)
    read = list(csv.DictReader(path.open()))
    assert len(read) == 8 and read[0]["server"] == "kvserve-disk" and read[0]["ttft_ms"] == "5000.0000"
    assert read[4]["cached_tokens"] == ""  # not reported by the peer
    summaries = {k: summarize_turns(v) for k, v in results.items()}
    console = Console(record=True, width=200)
    console.print(report.multiturn_table(summaries, "mt"))
    text = console.export_text()
    assert "3 (after restart)" in text and "90%" in text
    png = plots.plot_multiturn(summaries, tmp_path / "mt.png", "mt", restart_after=2)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_serve_and_context_outputs(tmp_path: Path) -> None:
    ok = [RequestResult(True, 10, 5, ttft=0.1, itl=(0.01,) * 4, latency=0.14)]
    by_label = {"kvserve": compute_metrics(ok, 1.0), "llama-server": compute_metrics(ok * 2, 4.0)}
    console = Console(record=True, width=200)
    console.print(report.serve_table(by_label, "serve"))
    text = console.export_text()
    assert "output throughput kvserve / llama-server" in text and "2.00x" in text
    assert plots.plot_serve(by_label, tmp_path / "s.png", "s").stat().st_size > 0
    points = [
        point(f, f // 2, RequestResult(True, f, 9, ttft=1.0, latency=2.0, cached_tokens=f // 2), f)
        for f in (512, 1024)
    ]
    assert plots.plot_context({"kvserve": points}, tmp_path / "c.png", "c").stat().st_size > 0
    rows = [{"server": "kvserve", **p.row()} for p in points]
    assert (
        next(csv.DictReader(report.write_csv(tmp_path / "c.csv", rows).open()))["prefill_tok_s"] == "256.0000"
    )


def test_the_client_bound_warning_needs_a_run_long_enough_to_judge(capsys) -> None:
    """A run whose requests all failed at once is mostly the client's start-up: its CPU share says
    nothing about the client keeping up with a server, so no warning (the shares still print)."""
    from kvserve.bench.serve_bench import _report_client_load

    _report_client_load([1.0, 0.4], duration=0.05)
    short = capsys.readouterr().err
    assert "100% 40%" in short and "warning" not in short
    _report_client_load([0.95, 0.4], duration=30.0)
    assert "warning: a client process was busy" in capsys.readouterr().err
    _report_client_load([0.5, 0.4], duration=30.0)
    assert "warning" not in capsys.readouterr().err
