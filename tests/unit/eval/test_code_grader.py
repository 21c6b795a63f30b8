"""The sandboxed code grader: every HumanEval canonical solution passes, wrong or runaway code fails."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvserve.eval.eval_case import EvalCase
from kvserve.eval.grade import CaseStatus, ModelOutput, grade
from kvserve.eval.humaneval import load_humaneval
from kvserve.eval.sandbox import SandboxLimits, run_python

CASES = {case.id: case for case in load_humaneval()}


def _as_reply(case: EvalCase, body: str) -> ModelOutput:
    """What a chat model answers: the whole function in a fenced block, after some prose."""
    return ModelOutput(f"Here is the function.\n\n```python\n{case.prompt}{body}```\n")


def test_all_164_canonical_solutions_pass() -> None:
    assert len(CASES) == 164
    with ThreadPoolExecutor(max_workers=8) as pool:
        grades = dict(zip(CASES, pool.map(lambda c: grade(c, _as_reply(c, c.answer)), CASES.values())))
    failed = {case_id: g.detail for case_id, g in grades.items() if g.status is not CaseStatus.PASSED}
    assert not failed


def test_a_bare_function_body_continues_the_prompt() -> None:
    case = CASES["HumanEval/23"]
    assert grade(case, ModelOutput(case.answer)).status is CaseStatus.PASSED


def test_a_wrong_solution_fails() -> None:
    case = CASES["HumanEval/23"]
    g = grade(case, _as_reply(case, "    return len(string) + 1\n"))
    assert g.status is CaseStatus.FAILED and "AssertionError" in g.detail


def test_code_cut_off_by_max_tokens_is_incomplete() -> None:
    case = CASES["HumanEval/23"]
    cut = ModelOutput("```python\ndef strlen(string: str) -> int:\n    return len(", finish_reason="length")
    assert grade(case, cut).status is CaseStatus.INCOMPLETE


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    case = CASES["HumanEval/23"]
    start = time.monotonic()
    g = grade(case, _as_reply(case, "    while True:\n        pass\n"), SandboxLimits(timeout_s=1.5))
    assert g.status is CaseStatus.FAILED and "timeout" in g.detail
    assert time.monotonic() - start < 10


def test_an_unbounded_allocation_is_stopped_by_the_memory_limit() -> None:
    case = CASES["HumanEval/23"]
    hog = "    blocks = []\n    while True:\n        blocks.append(bytearray(50_000_000))\n"
    g = grade(case, _as_reply(case, hog), SandboxLimits(timeout_s=20, memory_bytes=512 << 20))
    assert g.status is CaseStatus.FAILED and "MemoryError" in g.detail


def test_a_child_that_sleeps_past_the_timeout_is_killed_with_its_group() -> None:
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(timeout_s=1))
    assert not result.is_passed and result.detail.startswith("timeout") and result.elapsed_s < 10


@pytest.mark.parametrize(
    ("code", "blocked"),
    [
        ("import socket\nsocket.socket()", "socket"),
        ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1')", "urllib"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess"),
        ("import os\nos.system('true')", "os.system"),
        ("open('/tmp/kvserve-eval-escape', 'w')", "writing"),
        ("import os\nos.remove('/etc/hostname')", "os.remove"),
    ],
)
def test_network_processes_and_outside_writes_are_refused(code: str, blocked: str) -> None:
    result = run_python(code)
    assert not result.is_passed and "PermissionError" in result.detail and blocked in result.detail


def test_writes_inside_the_work_directory_are_allowed() -> None:
    assert run_python("open('scratch.txt', 'w').write('ok')\nimport os\nos.remove('scratch.txt')").is_passed


def test_each_run_gets_a_fresh_temporary_directory_that_is_removed() -> None:
    """The work directory is new per run (nothing a previous answer wrote is visible) and private."""
    probe = (
        "import os, stat\n"
        "assert os.path.basename(os.getcwd()).startswith('kvserve-eval-'), os.getcwd()\n"
        "assert sorted(os.listdir('.')) == ['program.py'], os.listdir('.')\n"
        "assert stat.S_IMODE(os.stat('.').st_mode) == 0o700\n"
        "open('left-behind.txt', 'w').write('x')\n"
    )
    first, second = run_python(probe), run_python(probe)
    assert first.is_passed and second.is_passed, (first.detail, second.detail)
