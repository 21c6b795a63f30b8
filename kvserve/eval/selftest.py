"""Model-free extractor cases: the hardening rules and their guards, run by `--self-test-extractors`
and by the unit tests. Each is (model output, answer kind, expected extraction)."""

from __future__ import annotations

from typing import NamedTuple

from kvserve.eval.eval_case import AnswerKind
from kvserve.eval.extract import (
    find_code,
    find_integer,
    find_letter,
    find_line_set,
    find_sequence,
    find_string,
)


class ExtractorCase(NamedTuple):
    rule: str
    text: str
    kind: AnswerKind
    expected: object
    num_choices: int = 10


EXTRACTOR_CASES: tuple[ExtractorCase, ...] = (
    # A pronoun or article opening the answer line is prose, not a choice.
    ExtractorCase("pronoun", "Answer: I think it is C", AnswerKind.CHOICE, "C"),
    ExtractorCase("article", "Answer: A careful reading shows C", AnswerKind.CHOICE, "C"),
    ExtractorCase("contraction", "Answer: I'll go with C.", AnswerKind.CHOICE, "C"),
    ExtractorCase("standalone I survives", "Answer: I.", AnswerKind.CHOICE, "I"),
    ExtractorCase("lone A with prose after", "Answer: A is correct", AnswerKind.CHOICE, "A"),
    # Negated distractors are skipped...
    ExtractorCase("not", "Answer: It is not B, the answer is D", AnswerKind.CHOICE, "D"),
    ExtractorCase("rules out", "Answer: rules out C, leaving D", AnswerKind.CHOICE, "D"),
    ExtractorCase("n't", "Answer: it isn't A; choose (B)", AnswerKind.CHOICE, "B", 4),
    ExtractorCase("eliminate", "Answer: eliminate option A and pick C", AnswerKind.CHOICE, "C", 4),
    # The issue's own examples, with no "Answer:" line: "answer is" and the last-letter fallback.
    ExtractorCase("not, no marker", "It is not B, the answer is D", AnswerKind.CHOICE, "D"),
    ExtractorCase("rules out, no marker", "rules out C, leaving D", AnswerKind.CHOICE, "D"),
    ExtractorCase("guard: the answer is D, not B", "The answer is D, not B", AnswerKind.CHOICE, "D"),
    # ...judged on the answer line only: the first real choice wins, a later negation cannot steal it.
    ExtractorCase("guard: D, not B", "Answer: D, not B", AnswerKind.CHOICE, "D"),
    ExtractorCase("guard: no look-back across lines", "It is not\nAnswer: B", AnswerKind.CHOICE, "B", 4),
    ExtractorCase(
        "last Answer: line wins", "Answer: A\nWait, re-checking.\nAnswer: C", AnswerKind.CHOICE, "C", 4
    ),
    ExtractorCase("letter beyond the choices", "Answer: E", AnswerKind.CHOICE, None, 4),
    ExtractorCase("no marker: last letter", "Options A and B fail, so C.", AnswerKind.CHOICE, "C", 4),
    ExtractorCase("markdown", "**Answer:** **(B)**", AnswerKind.CHOICE, "B", 4),
    ExtractorCase("answer on the next line", "Answer:\n\n**B**", AnswerKind.CHOICE, "B", 4),
    ExtractorCase("empty answer", "The answer is:\nAnswer:", AnswerKind.STRING, None),
    ExtractorCase("empty answers", "The answer is: \nAnswer: \nThe answer is: ", AnswerKind.STRING, None),
    ExtractorCase("reasoning ignored", "<think>Answer: A</think>\nAnswer: D", AnswerKind.CHOICE, "D", 4),
    # Integers: the value after the last '=' on the answer line; leading zeros dropped.
    ExtractorCase("equation", "Answer: m+n = 256+37 = 293", AnswerKind.INTEGER, 293),
    ExtractorCase("leading zeros", "Final answer: 082", AnswerKind.INTEGER, 82),
    ExtractorCase("equation, no marker", "m+n = 256+37 = 293", AnswerKind.INTEGER, 293),
    ExtractorCase("leading zeros, bare", "082", AnswerKind.INTEGER, 82),
    ExtractorCase("first integer on the line", "Answer: 17 apples (from 3 boxes)", AnswerKind.INTEGER, 17),
    ExtractorCase("answer line only", "Answer: 12\nChecked in 2024 by 3 people.", AnswerKind.INTEGER, 12),
    ExtractorCase("negative", "The answer is -40.", AnswerKind.INTEGER, -40),
    ExtractorCase("thousands", "Answer: 1,234", AnswerKind.INTEGER, 1234),
    ExtractorCase("decimal is not an integer", "Answer: 2.5 or 3", AnswerKind.INTEGER, 3),
    ExtractorCase("boxed", "so we get \\boxed{45} in total", AnswerKind.INTEGER, 45),
    ExtractorCase("fallback: last integer", "3 + 4 gives 7", AnswerKind.INTEGER, 7),
    # Strings, sequences, line sets, code.
    ExtractorCase("string quotes and period", 'Answer: "Olleh".', AnswerKind.STRING, "olleh"),
    ExtractorCase("string from 'answer is'", "So the answer is Paris", AnswerKind.STRING, "paris"),
    ExtractorCase("sequence", "Answer: pear, apple, fig", AnswerKind.SEQUENCE, ("pear", "apple", "fig")),
    ExtractorCase("sequence arrows", "Answer: 3 -> 1 -> 2", AnswerKind.SEQUENCE, ("3", "1", "2")),
    ExtractorCase("line range", "Answer: 20-22", AnswerKind.LINE_SET, frozenset({20, 21, 22})),
    ExtractorCase("line list", "Answer: lines 9 and 15", AnswerKind.LINE_SET, frozenset({9, 15})),
    ExtractorCase(
        "code block defining the function",
        "Here:\n```python\nimport os\n```\n```python\ndef f(x):\n    return x\n```",
        AnswerKind.CODE,
        "def f(x):\n    return x\n",
    ),
    ExtractorCase(
        "unclosed fence", "```python\ndef f(x):\n    return", AnswerKind.CODE, "def f(x):\n    return"
    ),
)


def extract(case: ExtractorCase) -> object:
    if case.kind is AnswerKind.CHOICE:
        return find_letter(case.text, case.num_choices)
    if case.kind is AnswerKind.INTEGER:
        return find_integer(case.text)
    if case.kind is AnswerKind.STRING:
        return find_string(case.text)
    if case.kind is AnswerKind.SEQUENCE:
        return find_sequence(case.text)
    if case.kind is AnswerKind.LINE_SET:
        return find_line_set(case.text)
    return find_code(case.text, "f")


def run_self_test() -> list[str]:
    """One line per failing case (empty when all pass)."""
    failures = []
    for case in EXTRACTOR_CASES:
        got = extract(case)
        if got != case.expected:
            failures.append(f"{case.rule}: {case.text!r} -> {got!r}, expected {case.expected!r}")
    return failures
