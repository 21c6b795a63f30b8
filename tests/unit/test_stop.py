"""Stop strings: hold-back never leaks a partial stop string; every split gives the same output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvserve.chat.stop import StopMatcher


def _run(chunks: list[str], stop: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopMatcher(stop)
    emitted: list[str] = []
    stopped = False
    for chunk in chunks:
        emit, stopped = matcher.feed(chunk)
        emitted.append(emit)
        if stopped:
            break
    if not stopped:
        emitted.append(matcher.finish())
    return "".join(emitted), stopped, emitted


GOLDEN = [
    # (text, stop strings, expected output, stopped)
    ("Hello world", ["wor"], "Hello ", True),
    ("Hello world", ["xyz"], "Hello world", False),
    ("aaab", ["aab"], "a", True),
    ("abcd", ["abcd", "bc"], "a", True),  # "bc" ends first
    ("abcd", ["ab", "b"], "", True),  # tie on the end: the earlier start wins
    ("say STOP now", ["STOP", "now"], "say ", True),
    ("héllo 世界 STOP", ["STOP"], "héllo 世界 ", True),
    ("ends with ST", ["STOP"], "ends with ST", False),  # a partial match at the end is released
    ("", ["x"], "", False),
    ("x", [""], "x", False),  # empty stop strings are ignored
]


@pytest.mark.parametrize(("text", "stop", "expected", "expected_stopped"), GOLDEN)
def test_every_split_gives_the_same_output(
    text: str, stop: list[str], expected: str, expected_stopped: bool
) -> None:
    splits = [[text]] + [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for chunks in splits:
        out, stopped, _ = _run(chunks, stop)
        assert (out, stopped) == (expected, expected_stopped), chunks


def test_partial_stop_string_is_held_back() -> None:
    matcher = StopMatcher(["</end>"])
    assert matcher.feed("abc</e") == ("abc", False)
    assert matcher.feed("n") == ("", False)
    assert matcher.feed("x!") == ("</enx!", False)
    assert matcher.feed("</end> tail") == ("", True)
    assert matcher.matched == "</end>"
    assert matcher.feed("more") == ("", True)


@given(
    st.text(alphabet="abc", max_size=30),
    st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(1, 6), min_size=1, max_size=6),
)
def test_random_chunkings_agree_with_whole_text(text: str, stop: list[str], sizes: list[int]) -> None:
    chunks, i, k = [], 0, 0
    while i < len(text):
        chunks.append(text[i : i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    whole = _run([text], stop)[:2]
    assert _run(chunks, stop)[:2] == whole
    assert _run(list(text), stop)[:2] == whole
    out, _stopped, _pieces = _run(chunks, stop)
    # Nothing emitted ever contains a stop string.
    assert not any(s in out for s in stop)
