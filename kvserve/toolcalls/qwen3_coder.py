"""Qwen3-Coder XML calls:

    <tool_call>
    <function=name>
    <parameter=key>
    value
    </parameter>
    </function>
    </tool_call>

Values are raw text typed by the tool's JSON schema. Values are not escaped by the template, so a
`</parameter>` only closes a value when the next tag (`<parameter=`, `</function>`) or the end follows it.
A bare `<function=…>…</function>` without the wrapper is accepted too (the model sometimes drops it).
"""

from __future__ import annotations

from typing import Any

from kvserve.toolcalls.live import LiveParam, LiveView, arguments_prefix, closed_value, schema_param
from kvserve.toolcalls.syntax import NEEDS_MORE, ParamSchemas, ParsedCall, ParseResult, coerce_value
from kvserve.toolcalls.xml_scan import is_partial, one_newline_trimmed, skip_ws, strip_partial

tool_call_start = ("<tool_call>", "<function=")
tool_call_end = ("</tool_call>", "</function>")

_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAM, _PARAM_END = "<parameter=", "</parameter>"


class _Cut(Exception):
    """The block ended inside an element."""


def parse_tool_call(block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult:
    body = block.removeprefix("<tool_call>")
    body = strip_partial(body, "</tool_call>") if is_truncated else body.removesuffix("</tool_call>")
    calls: list[ParsedCall] = []
    pos = skip_ws(body, 0)
    try:
        while pos < len(body):
            if not body.startswith(_FUNCTION, pos):
                if is_truncated and is_partial(body[pos:], _FUNCTION):
                    break
                return None
            pos = skip_ws(body, _function(body, pos, tools, is_truncated, calls))
    except _Cut:
        if not is_truncated:
            return NEEDS_MORE
    except ValueError:  # malformed: the caller returns the block as text
        return None
    return calls or None


def _function(body: str, pos: int, tools: ParamSchemas, is_truncated: bool, calls: list[ParsedCall]) -> int:
    """Parse one function element into `calls` (appended before its parameters are read, so a cut
    inside one keeps what came before); returns the position after it."""
    name_end = body.find(">", pos)
    if name_end < 0:
        raise _Cut
    name = body[pos + len(_FUNCTION) : name_end].strip()
    if not name:
        raise ValueError("function without a name")
    schemas = tools.get(name, {})
    arguments: dict[str, Any] = {}
    calls.append(ParsedCall(name, arguments))
    pos = name_end + 1
    while True:
        pos = skip_ws(body, pos)
        if body.startswith(_FUNCTION_END, pos):
            return pos + len(_FUNCTION_END)
        if pos == len(body):  # `</function>` missing but every value closed: accept
            return pos
        if not body.startswith(_PARAM, pos):
            if is_truncated and is_partial(body[pos:], _PARAM, _FUNCTION_END):
                return len(body)
            raise ValueError("unexpected text between parameters")
        pos = _parameter(body, pos, schemas, arguments, is_truncated)


def _parameter(body: str, pos: int, schemas: Any, arguments: dict[str, Any], is_truncated: bool) -> int:
    key_end = body.find(">", pos)
    if key_end < 0:
        raise _Cut
    key = body[pos + len(_PARAM) : key_end].strip()
    start = key_end + 1
    end = body.find(_PARAM_END, start)
    while end >= 0:
        after = skip_ws(body, end + len(_PARAM_END))
        if after == len(body) or body.startswith((_PARAM, _FUNCTION_END), after):
            arguments[key] = coerce_value(one_newline_trimmed(body[start:end]), schemas.get(key))
            return end + len(_PARAM_END)
        end = body.find(_PARAM_END, end + 1)
    if not is_truncated:
        raise _Cut
    arguments[key] = coerce_value(
        one_newline_trimmed(strip_partial(body[start:], _PARAM_END)), schemas.get(key)
    )
    return len(body)


def live_call(block: str, tools: ParamSchemas) -> LiveView | None:
    """The open block's first function as far as it is certain (see live.py); None before its name."""
    body = block.removeprefix("<tool_call>")
    pos = skip_ws(body, 0)
    name_end = body.find(">", pos)
    if not body.startswith(_FUNCTION, pos) or name_end < 0:
        return None
    name = body[pos + len(_FUNCTION) : name_end].strip()
    if not name:
        return None
    schemas = tools.get(name, {})
    params: list[LiveParam] = []
    pos = name_end + 1
    while True:
        pos = skip_ws(body, pos)
        key_end = body.find(">", pos)
        if not body.startswith(_PARAM, pos) or key_end < 0:
            break
        key = body[pos + len(_PARAM) : key_end].strip()
        raw, done, pos = closed_value(body, key_end + 1, _PARAM_END, (_PARAM, _FUNCTION_END))
        if done:
            raw = one_newline_trimmed(raw)
        else:  # the template's framing newlines: the first is dropped, a last one may be
            raw = raw.removeprefix("\n") if raw else raw
            raw = raw.removesuffix("\n")
        params.append(schema_param(key, raw, done, schemas))
        if not done:
            break
    return LiveView(name, arguments_prefix(params))
