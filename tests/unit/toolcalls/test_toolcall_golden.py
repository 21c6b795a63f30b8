"""Golden outputs per syntax, each checked under every chunking (whole, every 2-way split, 1 char)."""

from __future__ import annotations

import pytest
from split_points import assert_split_invariant, merged, run
from toolcall_cases import GOLDEN, TOOLS, compact

from kvserve.toolcalls import CallEnd, get_parser

CASES = [(name, text, expected) for name, cases in GOLDEN.items() for text, expected in cases]


@pytest.mark.parametrize(
    ("syntax", "text", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_golden_output_under_every_split(syntax: str, text: str, expected: list[tuple[str, ...]]) -> None:
    events = assert_split_invariant(lambda: get_parser(syntax, TOOLS), text)
    assert compact(events) == expected


@pytest.mark.parametrize("syntax", sorted(GOLDEN))
def test_raw_block_is_the_exact_sampled_markup(syntax: str) -> None:
    """What tool replay memory stores: text + raw blocks rebuild the output (whitespace aside)."""
    for text, _ in GOLDEN[syntax]:
        events = merged(run(lambda: get_parser(syntax, TOOLS), [text]))
        rebuilt, last_raw = "", None
        for event in events:
            if hasattr(event, "text"):
                rebuilt += event.text
            elif isinstance(event, CallEnd) and event.raw is not last_raw:  # calls of one block share one raw
                last_raw = event.raw
                rebuilt += event.raw
        assert "".join(rebuilt.split()) == "".join(text.split())
