"""Random output never raises, never loses a character, and never depends on how it was chunked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from split_points import assert_no_empty_deltas, merged, run
from toolcall_cases import GOLDEN, TOOLS

from kvserve.toolcalls import CallEnd, TextChunk, get_parser

_D = "｜DSML｜"
# Pieces of every syntax's markup, so random strings hit partial, nested and broken structures often.
PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<tool_ca",
    "</tool",
    '{"name": "f", "arguments": {',
    '{"name"',
    '"a": ',
    '"x"',
    "}",
    "]",
    "[",
    "{",
    '"',
    "\\",
    ",",
    ":",
    "<function=bash>",
    "</function>",
    "<parameter=cmd>",
    "</parameter>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    f"<{_D}tool_calls>",
    f"</{_D}tool_calls>",
    f'<{_D}invoke name="f">',
    f"</{_D}invoke>",
    f'<{_D}parameter name="p" string="true">',
    f'<{_D}parameter name="q" string="false">',
    f'<{_D}parameter name="o">',
    f"</{_D}parameter>",
    "<tool_calls>",
    "<|python_tag|>",
    ";",
    "<",
    ">",
    "/",
    "=",
    "\n",
    " ",
    "\n\n",
    "😀",
    "é",
    "text",
    "&lt;",
]
outputs = st.one_of(
    st.text(max_size=60),
    st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=25).map("".join),
)


def _nonspace(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("syntax", sorted(GOLDEN))
@settings(max_examples=150, deadline=None)
@given(text=outputs, cut=st.integers(min_value=0, max_value=200))
def test_random_output_is_kept_and_split_invariant(syntax: str, text: str, cut: int) -> None:
    def make():
        return get_parser(syntax, TOOLS)

    whole = run(make, [text])
    assert_no_empty_deltas(whole)
    cut %= len(text) + 1
    assert merged(run(make, [text[:cut], text[cut:]])) == merged(whole)
    assert merged(run(make, list(text))) == merged(whole)
    calls = [e for e in merged(whole) if isinstance(e, CallEnd)]
    visible = "".join(e.text for e in whole if isinstance(e, TextChunk))
    if not calls:
        assert visible == text  # nothing parsed: every character comes back as text, exactly
    else:  # text + each block's sampled markup, in order, rebuild the output; only separators may go
        rebuilt, last_raw = "", None
        for event in merged(whole):  # (without calls aborted when their block went malformed)
            if isinstance(event, TextChunk):
                rebuilt += event.text
            elif isinstance(event, CallEnd) and event.raw is not last_raw:  # calls of one block share one raw
                last_raw = event.raw
                rebuilt += event.raw
        assert _nonspace(rebuilt) == _nonspace(text)


@pytest.mark.parametrize("syntax", sorted(GOLDEN))
@settings(max_examples=60, deadline=None)
@given(prefix=st.text(max_size=10), chunks=st.lists(st.integers(1, 8), min_size=1, max_size=30))
def test_golden_with_random_prefix_and_chunking(syntax: str, prefix: str, chunks: list[int]) -> None:
    for text, _ in GOLDEN[syntax]:
        full = prefix + text
        pieces, pos = [], 0
        for size in chunks * (len(full) // max(1, sum(chunks)) + 1):
            pieces.append(full[pos : pos + size])
            pos += size

        def make():
            return get_parser(syntax, TOOLS)

        assert merged(run(make, pieces)) == merged(run(make, [full]))


_DEEP = 5000
DEEP_OUTPUTS = {
    "hermes": '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * _DEEP + "]" * _DEEP + "}}</tool_call>",
    "qwen3_coder": "<tool_call><function=write><parameter=opts>" + "[" * _DEEP + "]" * _DEEP + "</parameter>",
    "glm": "<tool_call>write<arg_key>opts</arg_key><arg_value>" + "[" * _DEEP + "]" * _DEEP + "</arg_value>",
    "deepseek_dsml": f'<{_D}tool_calls><{_D}invoke name="f">' + f'<{_D}parameter name="o">' * _DEEP + "x",
    "llama3_json": '{"name": "f", "parameters": {"a": ' + "[" * _DEEP + "]" * _DEEP + "}}",
}


@pytest.mark.parametrize("syntax", sorted(DEEP_OUTPUTS))
@pytest.mark.parametrize("truncated", [False, True])
def test_absurd_nesting_never_raises(syntax: str, truncated: bool) -> None:
    """json and recursive descent raise RecursionError on deep nesting; that output is text (or a call)."""
    text = DEEP_OUTPUTS[syntax]
    text = text[: len(text) * 3 // 4] if truncated else text
    events = run(lambda: get_parser(syntax, TOOLS), [text])
    visible = "".join(e.text for e in events if isinstance(e, TextChunk))
    assert visible == text or any(isinstance(e, CallEnd) for e in events)
