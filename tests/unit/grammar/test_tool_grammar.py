"""Tool-call grammars per syntax: they accept the calls each parser reads, reject malformed ones, and
whatever a model samples under them parses into a schema-valid call."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvserve.grammar.compiler import GrammarCompiler, GrammarError
from kvserve.grammar.json_format import json_grammar
from kvserve.grammar.tool_grammar import SYNTAXES, UnknownSyntaxError, tool_call_grammar
from kvserve.toolcalls import CallEnd, CallStart, TextChunk, get_parser
from tests.unit.grammar.grammar_helpers import accepts, random_walk


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    },
)
# No free text: a uniform random walk over its grammar ends quickly.
SWITCH = Tool(
    "switch",
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "mode": {"type": "string", "enum": ["on", "off"]},
            "force": {"type": "boolean"},
        },
        "required": ["n", "mode"],
    },
)
TOOLS = (WEATHER, SWITCH)

_D = "｜DSML｜"
GOLDEN = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris <&> \\"x\\"", "days": 3}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris <&> \\"x\\"", "days": 3}}',
    "qwen3_coder": '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <&> "x"\nl2 </parameter> x\n'
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "glm": '<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris <&> "x"</arg_value>\n'
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "deepseek_dsml": f'<{_D}tool_calls>\n<{_D}invoke name="get_weather">\n'
    f'<{_D}parameter name="city" string="true">Paris <&> "x"</{_D}parameter>\n'
    f'<{_D}parameter name="days" string="false">3</{_D}parameter>\n</{_D}invoke>\n</{_D}tool_calls>',
}
CITY = {
    "hermes": 'Paris <&> "x"',
    "llama3_json": 'Paris <&> "x"',
    "qwen3_coder": 'Paris <&> "x"\nl2 </parameter> x',
    "glm": 'Paris <&> "x"',
    "deepseek_dsml": 'Paris <&> "x"',
}


def parse(syntax: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    parser = get_parser(syntax, TOOLS)
    events = parser.feed(text) + parser.finish()
    assert not [e for e in events if isinstance(e, TextChunk) and e.text.strip()], events
    names = [e.name for e in events if isinstance(e, CallStart)]
    arguments = [json.loads(e.arguments) for e in events if isinstance(e, CallEnd)]
    return list(zip(names, arguments, strict=True))


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_golden_call_is_accepted_and_parses_back(compiler: GrammarCompiler, syntax: str) -> None:
    text = GOLDEN[syntax]
    assert accepts(compiler.constraint(tool_call_grammar(syntax, TOOLS)), text)
    assert parse(syntax, text) == [("get_weather", {"city": CITY[syntax], "days": 3})]


def _mutations(syntax: str) -> dict[str, str]:
    text = GOLDEN[syntax]
    days = {"hermes": '"days": 3', "llama3_json": '"days": 3'}.get(
        syntax, "3\n" if syntax == "qwen3_coder" else "3<"
    )
    bad_days = days.replace("3", '"three"' if syntax in ("hermes", "llama3_json") else "three")
    return {
        "unknown tool": text.replace("get_weather", "get_wether"),
        "text before the call": "Sure! " + text,
        "wrong argument type": text.replace(days, bad_days, 1),
        "truncated": text[: len(text) // 2],
    }


@pytest.mark.parametrize("syntax", SYNTAXES)
@pytest.mark.parametrize("case", ["unknown tool", "text before the call", "wrong argument type", "truncated"])
def test_malformed_calls_are_rejected(compiler: GrammarCompiler, syntax: str, case: str) -> None:
    text = _mutations(syntax)[case]
    assert text != GOLDEN[syntax]
    assert not accepts(compiler.constraint(tool_call_grammar(syntax, TOOLS)), text)


@pytest.mark.parametrize("syntax", SYNTAXES)
def test_missing_required_argument_is_rejected(compiler: GrammarCompiler, syntax: str) -> None:
    # The golden call without its required "city".
    constraint = compiler.constraint(tool_call_grammar(syntax, (WEATHER,)))
    without_city = {
        "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>',
        "llama3_json": '{"name": "get_weather", "parameters": {"days": 3}}',
        "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "glm": "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "deepseek_dsml": f'<{_D}tool_calls>\n<{_D}invoke name="get_weather">\n'
        f'<{_D}parameter name="days" string="false">3</{_D}parameter>\n</{_D}invoke>\n</{_D}tool_calls>',
    }[syntax]
    assert not accepts(constraint, without_city)


def test_named_choice_allows_exactly_one_call(compiler: GrammarCompiler) -> None:
    one = GOLDEN["hermes"]
    assert accepts(compiler.constraint(tool_call_grammar("hermes", (WEATHER,), parallel=False)), one)
    assert not accepts(
        compiler.constraint(tool_call_grammar("hermes", (WEATHER,), parallel=False)), one + "\n" + one
    )
    assert accepts(
        compiler.constraint(tool_call_grammar("hermes", (WEATHER,), parallel=True)), one + "\n" + one
    )


def _valid_switch(arguments: dict[str, Any]) -> bool:
    return (
        isinstance(arguments.get("n"), int)
        and arguments.get("mode") in ("on", "off")
        and isinstance(arguments.get("force", False), bool)
        and set(arguments) <= {"n", "mode", "force"}
    )


@pytest.mark.parametrize("syntax", SYNTAXES)
@pytest.mark.parametrize("seed", range(4))
def test_any_sampling_under_the_grammar_gives_a_valid_call(
    compiler: GrammarCompiler, syntax: str, seed: int
) -> None:
    switch = Tool("switch", {**SWITCH.parameters, "additionalProperties": False})
    constraint = compiler.constraint(tool_call_grammar(syntax, (switch,)))
    text = random_walk(constraint, seed)
    assert constraint.is_finished or constraint.accept_token(258), text  # ended, or EOS accepted
    calls = parse(syntax, text)
    assert calls and all(name == "switch" and _valid_switch(args) for name, args in calls), text


def test_json_format_grammar(compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert accepts(compiler.constraint(json_grammar(schema)), '{"a": 1}')
    assert not accepts(compiler.constraint(json_grammar(schema)), '{"b": 1}')
    assert accepts(compiler.constraint(json_grammar(None)), '{"b": [1, "x"]}')
    assert not accepts(compiler.constraint(json_grammar(None)), "[1]")
    constraint = compiler.constraint(json_grammar(schema))
    text = random_walk(constraint, seed=1)
    assert constraint.is_finished and isinstance(json.loads(text)["a"], int)


def test_invalid_schema_is_a_grammar_error(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError):
        compiler.constraint(json_grammar({"type": "object", "properties": {"a": {"type": 5}}}))
    with pytest.raises(UnknownSyntaxError):
        tool_call_grammar("nope", TOOLS)


def test_compiled_grammars_are_cached_and_constraints_independent(compiler: GrammarCompiler) -> None:
    lark = json_grammar(None)
    first, second = compiler.constraint(lark), compiler.constraint(lark)
    assert compiler._prototype(lark) is compiler._prototype(lark)
    assert first.accept_token(ord("{")) and first.num_accepted_tokens == 1
    assert second.num_accepted_tokens == 0 and not second.accept_token(ord("x"))
    assert second.error
