"""GLM-4.5/4.6/4.7 calls: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>`
(newlines between the elements optional). The template writes strings raw and other values as JSON,
so values are typed by the tool's schema. One call per block."""

from __future__ import annotations

from typing import Any

from kvserve.toolcalls.live import LiveParam, LiveView, arguments_prefix, closed_value, schema_param
from kvserve.toolcalls.syntax import NEEDS_MORE, ParamSchemas, ParsedCall, ParseResult, coerce_value
from kvserve.toolcalls.xml_scan import is_partial, skip_ws, strip_partial

tool_call_start = "<tool_call>"
tool_call_end = "</tool_call>"

_KEY, _KEY_END = "<arg_key>", "</arg_key>"
_VALUE, _VALUE_END = "<arg_value>", "</arg_value>"


def parse_tool_call(block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult:
    body = block[len(tool_call_start) :]
    body = strip_partial(body, tool_call_end) if is_truncated else body.removesuffix(tool_call_end)
    name_end = body.find(_KEY)
    if name_end < 0:
        name_end = len(strip_partial(body, _KEY)) if is_truncated else len(body)
    name = body[:name_end].strip()
    if not name or "<" in name or "\n" in name:
        return None
    schemas = tools.get(name, {})
    arguments: dict[str, Any] = {}
    pos = skip_ws(body, name_end)
    while pos < len(body):
        step = _pair(body, pos, schemas, arguments, is_truncated)
        if step is None:
            return None
        if step < 0:
            return NEEDS_MORE
        pos = skip_ws(body, step)
    return [ParsedCall(name, arguments)]


def _pair(body: str, pos: int, schemas: Any, arguments: dict[str, Any], is_truncated: bool) -> int | None:
    """Parse one key/value pair at `pos`: the position after it, -1 if cut short, None if malformed."""
    cut = len(body) if is_truncated else -1
    if not body.startswith(_KEY, pos):
        return cut if is_truncated and is_partial(body[pos:], _KEY) else None
    key_end = body.find(_KEY_END, pos)
    if key_end < 0:
        return cut
    key = body[pos + len(_KEY) : key_end].strip()
    pos = skip_ws(body, key_end + len(_KEY_END))
    if not body.startswith(_VALUE, pos):
        return cut if is_partial(body[pos:], _VALUE) else None
    start = pos + len(_VALUE)
    end = body.find(_VALUE_END, start)
    while end >= 0:  # a value closes where the next key (or the end) follows
        after = skip_ws(body, end + len(_VALUE_END))
        if after == len(body) or body.startswith(_KEY, after):
            arguments[key] = coerce_value(body[start:end], schemas.get(key))
            return end + len(_VALUE_END)
        end = body.find(_VALUE_END, end + 1)
    if not is_truncated:
        return -1
    arguments[key] = coerce_value(strip_partial(body[start:], _VALUE_END), schemas.get(key))
    return len(body)


def live_call(block: str, tools: ParamSchemas) -> LiveView | None:
    """The open call as far as it is certain (see live.py); None before its name."""
    body = block[len(tool_call_start) :]
    name_end = body.find(_KEY)
    name = body[:name_end].strip()
    if name_end < 0 or not name or "<" in name or "\n" in name:
        return None
    schemas = tools.get(name, {})
    params: list[LiveParam] = []
    pos = name_end
    while True:
        pos = skip_ws(body, pos)
        key_end = body.find(_KEY_END, pos)
        if not body.startswith(_KEY, pos) or key_end < 0:
            break
        key = body[pos + len(_KEY) : key_end].strip()
        pos = skip_ws(body, key_end + len(_KEY_END))
        if not body.startswith(_VALUE, pos):
            break
        raw, done, pos = closed_value(body, pos + len(_VALUE), _VALUE_END, (_KEY, tool_call_end))
        params.append(schema_param(key, raw, done, schemas))
        if not done:
            break
    return LiveView(name, arguments_prefix(params))
