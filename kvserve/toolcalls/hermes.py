"""Hermes / ChatML / Qwen2.5: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one call per block."""

from __future__ import annotations

import json
from typing import Any

from kvserve.toolcalls.live import LiveView
from kvserve.toolcalls.live_json import live_json_call
from kvserve.toolcalls.partial_json import loads_repaired
from kvserve.toolcalls.syntax import JSON_ERRORS, NEEDS_MORE, ParamSchemas, ParsedCall, ParseResult
from kvserve.toolcalls.xml_scan import strip_partial

tool_call_start = "<tool_call>"
tool_call_end = "</tool_call>"


def parse_tool_call(block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult:
    body = block.removeprefix(tool_call_start)
    if is_truncated:
        return call_from_json(loads_repaired(strip_partial(body, tool_call_end).strip()))
    body = body.removesuffix(tool_call_end)
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        # Cut inside a string or before the object closed: the `</tool_call>` we stopped at was a value.
        return NEEDS_MORE if _is_unfinished(body, error) else None
    except RecursionError:
        return None
    return call_from_json(value)


def call_from_json(value: Any) -> list[ParsedCall] | None:
    """`{"name": str, "arguments"|"parameters": object or JSON text of one}` -> the call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except JSON_ERRORS:
            return None
    if not isinstance(arguments, dict):
        return None
    return [ParsedCall(value["name"], arguments)]


def _is_unfinished(body: str, error: json.JSONDecodeError) -> bool:
    if not body.strip():
        return False
    return error.msg.startswith("Unterminated string") or error.pos >= len(body.rstrip())


def live_call(block: str, tools: ParamSchemas) -> LiveView | None:
    """The call as far as it is certain (live_json.py)."""
    return live_json_call(block, len(tool_call_start))
