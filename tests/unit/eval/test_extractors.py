"""Every extractor hardening rule and its guard cases (the same table `--self-test-extractors` runs)."""

from __future__ import annotations

import pytest

from kvserve.eval.extract import find_integer, find_letter, parse_integer, parse_line_set, visible_text
from kvserve.eval.selftest import EXTRACTOR_CASES, ExtractorCase, extract, run_self_test


@pytest.mark.parametrize("case", EXTRACTOR_CASES, ids=[c.rule for c in EXTRACTOR_CASES])
def test_extractor_rule(case: ExtractorCase) -> None:
    assert extract(case) == case.expected


def test_the_self_test_reports_a_broken_rule() -> None:
    assert run_self_test() == []
    broken = ExtractorCase("wrong on purpose", "Answer: D, not B", EXTRACTOR_CASES[0].kind, "B")
    assert extract(broken) != broken.expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The naive "last letter on the line" rule would say B here: the guard case of the seed.
        ("Answer: D, not B", "D"),
        ("Answer: I'm sure it's not A. It is B", "B"),
        ("Answer: we can rule out A and B, so C", "C"),
        ("Answer: A and B are rejected; D", "D"),
        ("The answer is not\nC", "C"),  # the negation is on another line: it does not count
    ],
)
def test_negation_cues(text: str, expected: str) -> None:
    assert find_letter(text, 4) == expected


def test_prose_capitals_are_skipped_only_when_something_else_is_there() -> None:
    assert find_letter("Answer: I think the best option is J", 10) == "J"
    assert find_letter("Answer: I think so", 10) == "I"  # nothing else: the reverse scan keeps it
    assert find_letter("Answer: A careful reading", 4) == "A"


def test_no_answer_at_all() -> None:
    assert find_letter("I cannot decide.", 4) is None
    assert find_integer("no numbers here") is None


def test_integer_rules() -> None:
    assert find_integer("Answer: m+n = 256+37 = 293") == 293
    assert find_integer("Answer: a+b+c = 10+20+30 = 060") == 60
    assert find_integer("We add 3 and 4.\nAnswer: 7\nThat took 12 seconds.") == 7
    assert parse_integer("082") == 82 and parse_integer("-5") == -5 and parse_integer("5.5") is None


def test_line_sets() -> None:
    assert parse_line_set("9") == {9}
    assert parse_line_set("9,15") == {9, 15}
    assert parse_line_set("20-22") == {20, 21, 22}


def test_reasoning_before_think_close_is_not_the_answer() -> None:
    assert visible_text("<think>Answer: 1</think>Answer: 2") == "Answer: 2"
    assert find_integer("<think>Answer: 1</think>Answer: 2") == 2
