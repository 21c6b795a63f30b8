"""Syntax choice from chat templates, the registry, and the small shared helpers."""

from __future__ import annotations

import pytest

from kvserve.toolcalls import SYNTAXES, UnknownToolParserError, detect_parser, get_parser
from kvserve.toolcalls.partial_json import close_json, loads_repaired
from kvserve.toolcalls.syntax import coerce_value

# The telling fragments of real templates (enough of each to carry its markers).
TEMPLATES = {
    "deepseek_dsml": "{{'<｜Assistant｜>'}}{%- for tool in tools %}<｜DSML｜invoke name=\"{{ tool.name }}\">",
    "qwen3_coder": "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}",
    "glm": "<tool_call>{{ tc.name }}{% for k, v in args %}<arg_key>{{ k }}</arg_key><arg_value>",
    "hermes": '{{- "<tool_call>\\n{\\"name\\": \\"" + tool_call.name }}<|im_start|>assistant',
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|>{%- if tools is not none %}<|python_tag|>",
}


@pytest.mark.parametrize(("expected", "template"), sorted(TEMPLATES.items()))
def test_detect_parser_from_template_markers(expected: str, template: str) -> None:
    assert detect_parser(template) == expected


@pytest.mark.parametrize("template", [None, "", "{{ messages[0].content }}<|im_start|>assistant"])
def test_templates_without_tool_markup_get_the_hermes_fallback(template: str | None) -> None:
    assert detect_parser(template) == "hermes"


def test_every_syntax_is_registered_and_unknown_names_are_refused() -> None:
    assert set(SYNTAXES) == {"hermes", "qwen3_coder", "glm", "deepseek_dsml", "llama3_json"}
    with pytest.raises(UnknownToolParserError, match="choose one of"):
        get_parser("nope")


def test_each_parser_is_fresh_state() -> None:
    first = get_parser("hermes")
    first.feed("<tool_call>{")
    assert get_parser("hermes").feed("hi") == get_parser("hermes").feed("hi")


@pytest.mark.parametrize(
    ("cut", "closed"),
    [
        ('{"a": [1, 2', '{"a": [1, 2]}'),
        ('{"a": "x', '{"a": "x"}'),
        ('{"a": "x\\', '{"a": "x"}'),
        ('{"a": "\\u12', '{"a": ""}'),
        ('{"a": 1,', '{"a": 1}'),
        ('{"a":', '{"a": null}'),
        ('{"a": "}]"', '{"a": "}]"}'),
    ],
)
def test_close_json_closes_in_reverse_nesting_order(cut: str, closed: str) -> None:
    assert close_json(cut) == closed
    assert loads_repaired(cut) is not None


def test_close_json_gives_up_on_cut_literals() -> None:
    assert loads_repaired('{"a": tru') is None


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("5", {"type": "integer"}, 5),
        ("5.0", {"type": "integer"}, 5),
        ("5", {"type": "string"}, "5"),
        ("5", None, "5"),
        ("True", {"type": "boolean"}, True),
        ("[1]", {"anyOf": [{"type": "array"}, {"type": "null"}]}, [1]),
        ("x y", {"type": "object"}, "x y"),
        ("2", {"enum": [1, 2]}, 2),
        ("a", {"enum": ["a", "b"]}, "a"),
    ],
)
def test_coerce_value_types_by_schema(raw: str, schema: object, value: object) -> None:
    assert coerce_value(raw, schema) == value
