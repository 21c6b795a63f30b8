"""The non-interactive run (`--plain`, or no terminal): one line per finished case, then the report."""

from __future__ import annotations

import sys
from typing import TextIO

from kvserve.eval.grade import CaseStatus
from kvserve.eval.result import CaseResult
from kvserve.eval.runner import EvalRunner


def case_line(result: CaseResult, number: int, total: int) -> str:
    width = len(str(total))
    line = (
        f"[{number:>{width}}/{total}] {result.status.value:<10} {result.case.id:<28} {result.case.domain:<11}"
        f" got={result.extracted[:40]!r} ({result.elapsed_s:.1f}s)"
    )
    is_explained = result.detail and result.status is not CaseStatus.PASSED
    return f"{line}  {result.detail[:120]}" if is_explained else line


async def run_plain(runner: EvalRunner, out: TextIO = sys.stdout) -> list[CaseResult]:
    total = len(runner.runs)
    finished = 0
    notify = runner.on_finish

    def show(result: CaseResult) -> None:
        nonlocal finished
        finished += 1
        notify(result)
        print(case_line(result, finished, total), file=out, flush=True)

    runner.on_finish = show
    try:
        return await runner.run()
    finally:
        await runner.client.aclose()
