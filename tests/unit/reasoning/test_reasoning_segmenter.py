"""Reasoning segmenters: golden splits per family under every chunking, and random output."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from split_points import assert_no_empty_deltas, assert_split_invariant, merged, run

from kvserve.reasoning import (
    SYNTAXES,
    ContentChunk,
    ReasoningChunk,
    ReasoningSegmenter,
    detect_reasoning,
    prompt_opens_reasoning,
)

R, C = ReasoningChunk, ContentChunk

# (text with <o>/<c> standing for the family's tags, starts_in_reasoning, expected)
CASES = [
    ("<o>\nplan the fix\n</c>\n\nHere it is.", False, [R("plan the fix\n"), C("Here it is.")]),
    ("  <o>x</c>y", False, [R("x"), C("y")]),
    ("No reasoning at all.\n", False, [C("No reasoning at all.\n")]),
    ("  leading space kept", False, [C("  leading space kept")]),
    ("Answer mentions <o> and </c> literally", False, [C("Answer mentions <o> and </c> literally")]),
    ("<o>first</c>then <o>not again</c>", False, [R("first"), C("then <o>not again</c>")]),
    ("<o>unterminated: cut by max_tokens", False, [R("unterminated: cut by max_tokens")]),
    ("<o>ends on a partial close </", False, [R("ends on a partial close </")]),
    ("<o></c>", False, []),
    ("<o>x</c>\n\n", False, [R("x")]),
    ("<o", False, [C("<o")]),
    ("   ", False, [C("   ")]),
    ("😀<o>", False, [C("😀<o>")]),
    # the prompt opened the block: only the close tag is sampled
    ("plan\n</c>\n\nAnswer", True, [R("plan\n"), C("Answer")]),
    ("\n<o>\nplan</c>Answer", True, [R("plan"), C("Answer")]),  # the model re-opened it
    ("never closed", True, [R("never closed")]),
    ("</c>direct answer", True, [C("direct answer")]),
    ("<o", True, [R("<o")]),
]


def _spell(text: str, open_tag: str, close_tag: str) -> str:
    return text.replace("</c>", close_tag).replace("<o>", open_tag).replace("<o", open_tag[:-1])


@pytest.mark.parametrize("family", sorted(SYNTAXES))
@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
def test_golden_segments_under_every_split(family: str, text: str, inside: bool, expected: list) -> None:  # type: ignore[type-arg]
    syntax = SYNTAXES[family]
    text = _spell(text, syntax.open, syntax.close)
    expected = [type(e)(_spell(e.text, syntax.open, syntax.close)) for e in expected]
    events = assert_split_invariant(lambda: ReasoningSegmenter(syntax, starts_in_reasoning=inside), text)
    assert events == expected


PIECES = ["<think>", "</think>", "<thi", "</th", "<", "/", ">", "\n", " ", "a", "😀", "think"]
outputs = st.one_of(
    st.text(max_size=40), st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=20).map("".join)
)


@settings(max_examples=300, deadline=None)
@given(text=outputs, inside=st.booleans(), cut=st.integers(0, 100))
def test_random_output_is_kept_and_split_invariant(text: str, inside: bool, cut: int) -> None:
    syntax = SYNTAXES["think"]

    def make():
        return ReasoningSegmenter(syntax, starts_in_reasoning=inside)

    whole = run(make, [text])
    assert_no_empty_deltas(whole)
    cut %= len(text) + 1
    assert merged(run(make, [text[:cut], text[cut:]])) == merged(whole)
    assert merged(run(make, list(text))) == merged(whole)
    reasoning = "".join(e.text for e in whole if isinstance(e, ReasoningChunk))
    content = "".join(e.text for e in whole if isinstance(e, ContentChunk))
    if "<think>" not in text and "</think>" not in text:
        assert (reasoning, content) == ((text.lstrip(), "") if inside else ("", text))
    else:  # only the tags (at most one open, one close) and whitespace next to them are dropped
        dropped = len("".join(text.split())) - len("".join((reasoning + content).split()))
        assert dropped in (0, len("<think>"), len("</think>"), len("<think></think>"))


QWEN3_HYBRID = (
    "{%- if add_generation_prompt %}\n{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}\n{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "{%- endif %}\n{%- endif %}"
)
QWEN3_THINKING = (
    "{{ '</think>' }}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
DEEPSEEK = "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}{%- else %}{{'<think>'}}{%- endif %}{% endif %}"


@pytest.mark.parametrize(
    ("template", "name", "opens"),
    [
        (QWEN3_HYBRID, "think", False),
        (QWEN3_THINKING, "think", True),
        (DEEPSEEK, "think", True),
        ("{{ '<seed:think>' }}…{{ '</seed:think>' }}", "seed", False),
        ("[THINK]…[/THINK]", "mistral", False),
    ],
)
def test_detect_reasoning_from_template(template: str, name: str, opens: bool) -> None:
    syntax = detect_reasoning(template)
    assert syntax is not None and (syntax.name, syntax.opens_in_prompt) == (name, opens)


@pytest.mark.parametrize("template", [None, "", "<|im_start|>assistant"])
def test_templates_without_reasoning_markup(template: str | None) -> None:
    assert detect_reasoning(template) is None


def test_prompt_opens_reasoning_reads_the_rendered_prompt() -> None:
    syntax = SYNTAXES["think"]
    assert prompt_opens_reasoning("<｜User｜>Hi<｜Assistant｜><think>", syntax)
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", syntax)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", syntax)
