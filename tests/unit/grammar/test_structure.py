"""Structural greedy: which next bytes of a tool call are markup (greedy) and which are payload."""

from __future__ import annotations

import pytest

from kvserve.grammar.structure import structure_tracker


def _trace(syntax: str, text: str) -> str:
    """One char per byte of `text`: S if the byte was sampled as structure (greedy), p if as payload."""
    tracker = structure_tracker(syntax, lambda token_id: bytes([token_id]))
    assert tracker is not None
    marks = []
    for byte in text.encode():
        marks.append("S" if tracker.is_structural else "p")
        tracker.feed_token(byte)
    return "".join(marks)


def _split(text: str, trace: str) -> list[tuple[str, str]]:
    """Runs of equal marks over the bytes of `text`: [(mark, text)]."""
    runs: list[tuple[str, bytearray]] = []
    for byte, mark in zip(text.encode(), trace, strict=True):
        if runs and runs[-1][0] == mark:
            runs[-1][1].append(byte)
        else:
            runs.append((mark, bytearray([byte])))
    return [(mark, bytes(run).decode()) for mark, run in runs]


def test_hermes_markup_is_greedy_argument_strings_are_not() -> None:
    text = 'Hi <tool_call>\n{"name": "f", "arguments": {"a": "x\\"y", "n": 1}}\n</tool_call> ok'
    assert _split(text, _trace("hermes", text)) == [
        ("p", "Hi <tool_call>"),
        ("S", '\n{"name": "f", "arguments": {"a": "'),
        ("p", 'x\\"y"'),  # the closing quote is sampled as payload: it ends the value
        ("S", ', "n": 1}}\n</tool_call>'),
        ("p", " ok"),
    ]


def test_qwen3_coder_values_are_payload_until_a_partial_closing_tag() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=a>\nv</p\n</parameter>\n</function>\n</tool_call>"
    assert _split(text, _trace("qwen3_coder", text)) == [
        ("p", "<tool_call>"),
        ("S", "\n<function=f>\n<parameter=a>"),
        ("p", "\nv</"),
        ("S", "p\n"),  # after "</", which could start the closing tag: greedy
        ("p", "</"),
        ("S", "parameter>\n</function>\n</tool_call>"),
    ]


def test_glm_keys_are_greedy_values_are_not() -> None:
    text = "<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>"
    assert _split(text, _trace("glm", text)) == [
        ("p", "<tool_call>"),
        ("S", "f\n<arg_key>k</arg_key>\n<arg_value>"),
        ("p", "v</"),
        ("S", "arg_value>\n</tool_call>"),
    ]


def test_dsml_and_llama3_json() -> None:
    d = "｜DSML｜"
    text = f'<{d}tool_calls>\n<{d}invoke name="f">\n<{d}parameter name="a" string="true">v</{d}parameter>\n'
    runs = _split(text, _trace("deepseek_dsml", text))
    assert ("p", "v</") in runs and runs[-1][0] == "S"
    text = '{"name": "f", "parameters": {"a": "v"}} after'
    assert _split(text, _trace("llama3_json", text)) == [
        ("p", '{"name"'),
        ("S", ': "f", "parameters": {"a": "'),
        ("p", 'v"'),
        ("S", "}}"),
        ("p", " after"),
    ]


@pytest.mark.parametrize("syntax", ["nope"])
def test_unknown_syntax_has_no_tracker(syntax: str) -> None:
    assert structure_tracker(syntax, lambda t: b"") is None
