"""Lark grammars that force a tool call in a model's own syntax (`tool_choice` required or named).

One builder per syntax of `kvserve/toolcalls/`, writing calls exactly as that model's template renders
them (and as its parser reads them back), with arguments valid against the tool's JSON schema:

  hermes       <tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>
  llama3_json  {"name": "N", "parameters": {...}}   (several joined by "; ")
  qwen3_coder  <tool_call>\\n<function=N>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>
  glm          <tool_call>N\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>
  deepseek_dsml <｜DSML｜tool_calls>\\n<｜DSML｜invoke name="N">\\n<｜DSML｜parameter name="k"
               string="true|false">v</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n</｜DSML｜tool_calls>

In the XML-style syntaxes a string parameter is raw text (it only cannot contain its closing tag);
other types are JSON against the parameter's schema; parameters come in schema order, required ones
always, optional ones at the model's choice. Pure: the text is compiled by `grammar/compiler.py`.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvserve.grammar.lark import COMPACT_SEPARATORS, PROMPT_SEPARATORS, json_lexeme, lazy_text_until, literal
from kvserve.toolcalls.syntax import ToolLike, _schema_types  # the parsers' rule: both agree on raw vs JSON

# The rules of one call: (body of the call rule, extra rule lines).
_CallRules = tuple[str, list[str]]


class UnknownSyntaxError(ValueError):
    pass


def tool_call_grammar(syntax: str, tools: Sequence[ToolLike], parallel: bool = True) -> str:
    """A grammar for one call (or, with `parallel`, one or more) to any of `tools`, in `syntax`."""
    builder = _BUILDERS.get(syntax)
    if builder is None:
        raise UnknownSyntaxError(f"no grammar for tool-call syntax {syntax!r}")
    assert tools, "a forced call needs at least one tool"
    lines: list[str] = []
    bodies: list[str] = []
    for i, tool in enumerate(tools):
        body, extra = builder(f"t{i}", tool)
        bodies.append(body)
        lines += extra
    open_, separator, close = _FRAMES[syntax]
    calls = "call (" + literal(separator) + " call)*" if parallel else "call"
    start = " ".join(x for x in (open_, calls, close) if x)
    return "\n".join([f"start: {start}", "call: " + " | ".join(bodies), *lines]) + "\n"


def _properties(tool: ToolLike) -> list[tuple[str, Mapping[str, Any], bool]]:
    """(name, schema, required) per parameter, in schema order."""
    parameters = tool.parameters if isinstance(tool.parameters, Mapping) else {}
    props = parameters.get("properties")
    required = parameters.get("required") or ()
    if not isinstance(props, Mapping):
        return []
    return [(k, v if isinstance(v, Mapping) else {}, k in required) for k, v in props.items()]


def _is_raw_text(schema: Mapping[str, Any]) -> bool:
    """Written as raw text by the XML-style templates; the parsers coerce exactly these the same way."""
    types = _schema_types(schema)
    return not types or "string" in types


def _raw_value(rule: str, schema: Mapping[str, Any], closer: str) -> list[str]:
    """A raw-text value followed by `closer`: an enum of strings is a choice, anything else free text."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return [f"{rule}: " + " | ".join(literal(v + closer) for v in enum)]
    return [f"{rule}[lazy]: {lazy_text_until(closer)}"]


def _json_object(tool: ToolLike) -> Mapping[str, Any]:
    return tool.parameters if isinstance(tool.parameters, Mapping) else {"type": "object"}


def _hermes(rule: str, tool: ToolLike) -> _CallRules:
    head = literal(f'<tool_call>\n{{"name": {literal(tool.name)}, "arguments": ')
    return f"{head} {rule}_args {literal('}' + chr(10) + '</tool_call>')}", [
        f"{rule}_args: {json_lexeme(_json_object(tool))}"
    ]


def _llama3_json(rule: str, tool: ToolLike) -> _CallRules:
    head = literal(f'{{"name": {literal(tool.name)}, "parameters": ')
    return f"{head} {rule}_args {literal('}')}", [f"{rule}_args: {json_lexeme(_json_object(tool))}"]


def _xml_params(
    rule: str,
    tool: ToolLike,
    open_tag: Callable[[str, bool], str],
    closer: str,
    separators: tuple[str, str] = PROMPT_SEPARATORS,
) -> _CallRules:
    """Parameters in schema order: `open_tag(name, is_raw)`, the value, `closer`."""
    items: list[str] = []
    lines: list[str] = []
    for j, (name, schema, required) in enumerate(_properties(tool)):
        value = f"{rule}_v{j}"
        is_raw = _is_raw_text(schema)
        if is_raw:
            lines += _raw_value(value, schema, closer)
            param = f"{literal(open_tag(name, True))} {value}"
        else:
            lines.append(f"{value}: {json_lexeme(schema, separators)}")
            param = f"{literal(open_tag(name, False))} {value} {literal(closer)}"
        items.append(f"({param})" + ("" if required else "?"))
    return " ".join(items), lines


def _qwen3_coder(rule: str, tool: ToolLike) -> _CallRules:
    params, lines = _xml_params(rule, tool, lambda k, _: f"<parameter={k}>\n", "\n</parameter>\n")
    head = literal(f"<tool_call>\n<function={tool.name}>\n")
    return f"{head} {params} {literal('</function>' + chr(10) + '</tool_call>')}", lines


def _glm(rule: str, tool: ToolLike) -> _CallRules:
    params, lines = _xml_params(
        rule, tool, lambda k, _: f"<arg_key>{k}</arg_key>\n<arg_value>", "</arg_value>\n"
    )
    return f"{literal(f'<tool_call>{tool.name}' + chr(10))} {params} {literal('</tool_call>')}", lines


_DSML = "｜DSML｜"


def _dsml(rule: str, tool: ToolLike) -> _CallRules:
    def open_tag(name: str, is_raw: bool) -> str:
        kind = "true" if is_raw else "false"
        return f'<{_DSML}parameter name="{html.escape(name)}" string="{kind}">'

    params, lines = _xml_params(rule, tool, open_tag, f"</{_DSML}parameter>\n", COMPACT_SEPARATORS)
    head = literal(f'<{_DSML}invoke name="{html.escape(tool.name)}">\n')
    return f"{head} {params} {literal(f'</{_DSML}invoke>' + chr(10))}", lines


_BUILDERS: dict[str, Callable[[str, ToolLike], _CallRules]] = {
    "hermes": _hermes,
    "llama3_json": _llama3_json,
    "qwen3_coder": _qwen3_coder,
    "glm": _glm,
    "deepseek_dsml": _dsml,
}

# syntax -> (text before the calls, between two calls, after them), as Lark (literals or "")
_FRAMES: dict[str, tuple[str, str, str]] = {
    "hermes": ("", "\n", ""),
    "llama3_json": ("", "; ", ""),
    "qwen3_coder": ("", "\n", ""),
    "glm": ("", "\n", ""),
    # DSML wraps every invoke of a turn in one block; the calls join with nothing (each ends in "\n").
    "deepseek_dsml": (literal(f"<{_DSML}tool_calls>\n"), "", literal(f"</{_DSML}tool_calls>")),
}

SYNTAXES = tuple(_BUILDERS)
