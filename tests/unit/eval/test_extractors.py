"""Every extractor hardening rule and its guard cases (the same table `--self-test-extractors` runs)."""

from __future__ import annotations

import pytest

from kvserve.eval.extract import (
    find_integer,
    find_letter,
    find_string,
    has_answer,
    parse_integer,
    parse_line_set,
    visible_text,
    without_echo,
)
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


def test_prose_capitals_are_never_a_choice_without_an_answer_line() -> None:
    # The old last resort took the article: "A rectangle ..." -> A.
    assert find_letter("A rectangle is 5 cm long, so the area is 15.", 4) is None
    assert find_letter("I would go with the second one.", 10) is None
    assert find_letter("Looking again, A is correct.", 4) == "A"  # a letter stated as the answer
    assert find_letter("Answer: A is correct", 4) == "A"


def test_a_choice_named_only_by_its_text() -> None:
    choices = ("8", "15", "16", "30")
    assert find_letter("So the area is 5 cm * 3 cm = 15 square centimeters.", 4, choices) == "B"
    assert find_letter("It is 15 or 16.", 4, choices) is None  # two options named: no choice
    assert find_letter("It is 1.5 or 150.", 4, choices) is None  # "15" inside other numbers
    assert find_letter("C. 15", 4, choices) == "C"  # a letter wins over the text
    assert find_letter("The answer is carbon dioxide.", 4, ("oxygen", "carbon dioxide", "N", "He")) == "B"
    assert find_letter("I think n is right", 4, ("o", "n", "h", "c")) is None  # one-letter options


def test_an_echoed_prompt_is_not_the_answer() -> None:
    prompt = (
        "Read this.\n\n1. Ann is 7.\n2. Bo is 9.\n\nChoices:\nA. 7\nB. 9\n\nFinish with `Answer: <letter>`."
    )
    assert without_echo("1. Ann is 7.\n2. Bo is 9.", prompt) == ""
    assert without_echo("A. 7\n\nB. 9\nSo it is B.", prompt) == "So it is B."  # blank lines keep a run
    assert without_echo("B. 9", prompt) == "B. 9"  # one copied line names an option: kept
    assert (
        without_echo("2. Bo is 9.\nBo is older.\n1. Ann is 7.", prompt)
        == "2. Bo is 9.\nBo is older.\n1. Ann is 7."
    )
    assert (
        without_echo("2. Bo is 9.\n1. Ann is 7.", prompt) == "2. Bo is 9.\n1. Ann is 7."
    )  # picked, not echoed
    assert without_echo("1. Ann is 7.\nA. 7", prompt) == "1. Ann is 7.\nA. 7"  # not neighbours in the prompt


def test_the_prompts_placeholder_is_no_answer() -> None:
    assert not has_answer("Finish with a line of the form `Answer: <answer>`.")
    assert find_string("Answer: <answer>") is None
    assert find_letter("Answer: <letter>\nI pick C", 4) == "C"
    assert find_integer("Answer: <integer>\nIt is 12.") == 12


def test_integer_fallback_reads_the_last_line_with_a_number() -> None:
    assert find_integer("3.5 is equal to 3.5 * 60 = 21.5 minutes.") is None  # the result is no integer
    assert find_integer("47 + 38 = 85\nThat is the sum.") == 85
    assert find_integer("First 3, then 4, so 7 in all.") == 7
    assert find_integer("The ferry runs twice a day in summer.") == 2  # no digit: a number word
    assert find_integer("Answer: three") == 3
    assert find_integer("It runs twice, maybe three times.") is None  # two number words: no answer
    assert find_integer("It runs twice, on line 6.") == 6  # a digit beats number words
