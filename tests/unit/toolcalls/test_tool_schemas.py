"""Tool schemas from the three APIs -> ToolSpec, and canonical JSON: same meaning, same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.chat.conversation import ToolSpec
from kvserve.chat.tools import (
    ToolSchemaError,
    canonical_json,
    canonical_json_text,
    tool_schema_text,
    tools_from_anthropic,
    tools_from_openai,
    tools_from_responses,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "clients"
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "où — 😀"}},
    "required": ["path"],
}

# One schema, four ways a client may spell it on the wire.
SPELLINGS = [
    json.dumps(SCHEMA),
    json.dumps(SCHEMA, ensure_ascii=True),
    json.dumps(SCHEMA, indent=2),
    json.dumps(SCHEMA, separators=(",", ":"), ensure_ascii=True).replace("\\ud83d\\ude00", "\\uD83D\\uDE00"),
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_semantically_equal_schemas_give_identical_bytes(spelling: str) -> None:
    expected = '{"type": "object", "properties": {"path": {"type": "string", "description": "où — 😀"}}, "required": ["path"]}'
    assert canonical_json_text(spelling) == expected
    spec = tools_from_openai(
        [{"type": "function", "function": {"name": "read", "parameters": json.loads(spelling)}}]
    )[0]
    assert tool_schema_text(spec) == tool_schema_text(ToolSpec("read", "", SCHEMA))


def test_the_three_apis_give_the_same_spec() -> None:
    openai = tools_from_openai(
        [{"type": "function", "function": {"name": "read", "description": "d", "parameters": SCHEMA}}]
    )
    anthropic = tools_from_anthropic([{"name": "read", "description": "d", "input_schema": SCHEMA}])
    responses = tools_from_responses(
        [{"type": "function", "name": "read", "description": "d", "parameters": SCHEMA}]
    )
    assert openai == anthropic == responses == (ToolSpec("read", "d", SCHEMA),)


def test_key_order_is_the_clients() -> None:
    assert canonical_json_text('{"b": 1, "a": {"d": 2, "c": 3}}') == '{"b": 1, "a": {"d": 2, "c": 3}}'


def test_escapes_are_decoded_but_control_characters_and_lone_surrogates_stay_escaped() -> None:
    assert canonical_json_text('"\\u00e9\\n\\u0000\\"\\\\"') == '"é\\n\\u0000\\"\\\\"'
    text = canonical_json_text('"\\ud800x"')
    assert text == '"\\ud800x"'
    text.encode("utf-8")  # a prompt must be encodable


def test_non_json_arguments_are_left_as_sampled() -> None:
    assert canonical_json_text("{oops") == "{oops"
    assert canonical_json(1.5) == "1.5"


def test_responses_namespace_tools_are_flattened_and_hosted_tools_skipped() -> None:
    specs = tools_from_responses(
        [
            {
                "type": "namespace",
                "name": "mcp",
                "description": "x",
                "tools": [{"type": "function", "name": "ls"}, {"name": "cat"}],
            },
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "description": "patch"},
        ]
    )
    assert [s.name for s in specs] == ["mcp__ls", "mcp__cat", "apply_patch"]
    assert specs[2].parameters["properties"] == {"input": {"type": "string"}}


def test_anthropic_hosted_tools_are_skipped() -> None:
    specs = tools_from_anthropic(
        [{"type": "web_search_20250305", "name": "web_search"}, {"type": "custom", "name": "x"}]
    )
    assert [s.name for s in specs] == ["x"]
    assert specs[0].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("convert", "tools", "param"),
    [
        (tools_from_openai, [{"type": "function", "function": {"name": ""}}], "tools.0.function.name"),
        (tools_from_anthropic, [{"name": "x", "input_schema": [1]}], "tools.0.input_schema"),
        (tools_from_responses, [{"type": "namespace", "tools": []}], "tools.0.name"),
        (
            tools_from_responses,
            [{"type": "namespace", "name": "n", "tools": [{"name": 3}]}],
            "tools.0.tools.0.name",
        ),
    ],
)
def test_bad_tools_raise_with_the_body_path(convert, tools, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ToolSchemaError) as caught:
        convert(tools)
    assert caught.value.param == param


def test_codex_and_claude_code_tools_convert_and_render() -> None:
    codex = json.loads((FIXTURES / "codex-0.171.0_responses.json").read_text())
    claude = json.loads((FIXTURES / "claude-code-2.1.332_messages.json").read_text())
    specs = tools_from_responses(codex["tools"]) + tools_from_anthropic(claude["tools"])
    assert len(specs) >= 10
    for spec in specs:
        line = tool_schema_text(spec)
        assert "\n" not in line and json.loads(line)["function"]["name"] == spec.name
