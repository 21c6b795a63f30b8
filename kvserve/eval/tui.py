"""The interactive view: the case list with statuses beside the selected (or latest) case's output
as it streams. Keys: p pause/resume, q quit with the report, Up/Down select, Enter run the case.

The runner works on its own asyncio loop in a thread; this side only reads its state and posts
commands to that loop, so drawing never blocks a request.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine
from typing import Any

from rich.console import Console, Group
from rich.layout import Layout
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvserve.eval.grade import CaseStatus
from kvserve.eval.keys import key_reader
from kvserve.eval.result import CaseResult
from kvserve.eval.runner import EvalRunner

STYLE = {
    CaseStatus.PENDING: "dim",
    CaseStatus.RUNNING: "bold yellow",
    CaseStatus.PASSED: "green",
    CaseStatus.FAILED: "red",
    CaseStatus.INCOMPLETE: "magenta",
    CaseStatus.ERROR: "bold red",
    CaseStatus.STOPPED: "dim red",
}


class _View:
    """What the user looks at: the selected row, and whether the output pane follows new cases."""

    def __init__(self, runner: EvalRunner):
        self.runner = runner
        self.selected = 0
        self.is_following = True

    def shown_index(self) -> int:
        if self.is_following:
            running = [i for i, r in enumerate(self.runner.runs) if r.status is CaseStatus.RUNNING]
            if running:
                return running[-1]
        return self.selected

    def render(self, height: int) -> Layout:
        rows = max(height - 3, 1)  # inside the panels: the footer line and two border lines off
        layout = Layout()
        layout.split_column(Layout(name="body"), Layout(self._footer(), name="footer", size=1))
        layout["body"].split_row(
            Layout(self._case_list(rows), name="cases", ratio=2),
            Layout(self._output(rows), name="output", ratio=3),
        )
        return layout

    def _case_list(self, rows: int) -> Panel:
        runs = self.runner.runs
        top = max(0, min(self.selected - rows // 2, len(runs) - rows))
        table = Table.grid(padding=(0, 1))
        for i in range(top, min(top + rows, len(runs))):
            run = runs[i]
            marker = ">" if i == self.selected else " "
            table.add_row(marker, Text(run.status.value[:4], STYLE[run.status]), run.case.id, run.case.domain)
        return Panel(table, title=f"cases ({len(runs)})")

    def _output(self, rows: int) -> Panel:
        run = self.runner.runs[self.shown_index()]
        result = run.result
        body = run.text or (result.output.content if result.output else "")
        if result.output and result.output.tool_calls:
            body += "".join(f"\n[tool call] {c.name}({c.arguments})" for c in result.output.tool_calls)
        tail = "\n".join(body.splitlines()[-max(rows - 4, 1) :])
        lines: list[Any] = [Text(tail)]
        if result.status.is_done:
            lines.append(
                Text(f"\n{result.status.value}  extracted: {result.extracted[:60]!r}", STYLE[result.status])
            )
            if result.detail:
                lines.append(Text(result.detail[:200], "dim"))
        return Panel(Group(*lines), title=f"{run.case.id} [{result.status.value}]")

    def _footer(self) -> Text:
        counts: dict[CaseStatus, int] = {}
        for run in self.runner.runs:
            counts[run.status] = counts.get(run.status, 0) + 1
        text = "  ".join(f"{s.value.lower()} {n}" for s, n in counts.items())
        state = "PAUSED  " if self.runner.is_paused else ""
        return Text(f"{state}{text}   p pause  q quit  ↑/↓ select  Enter run", "reverse")


def run_tui(runner: EvalRunner, console: Console) -> list[CaseResult]:
    """Runs the cases under the TUI until q (the queue may be empty by then: Enter re-runs a case)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kvserve-eval-loop", daemon=True)
    thread.start()

    def call(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    view = _View(runner)
    try:
        call(runner.start())
        with key_reader() as keys, Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                live.update(view.render(console.size.height), refresh=True)
                try:
                    key = keys.get(timeout=0.12)
                except queue.Empty:
                    continue
                if key == "q":
                    break
                _handle(key, view, loop)
    finally:
        call(runner.stop())
        call(runner.client.aclose())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    return runner.results()


def _handle(key: str, view: _View, loop: asyncio.AbstractEventLoop) -> None:
    runner = view.runner
    if key == "p":
        loop.call_soon_threadsafe(runner.resume if runner.is_paused else runner.pause)
    elif key in ("up", "down"):
        step = -1 if key == "up" else 1
        view.selected = max(0, min(len(runner.runs) - 1, view.selected + step))
        view.is_following = False
    elif key == "enter":
        loop.call_soon_threadsafe(runner.enqueue, view.selected)
        view.is_following = False
