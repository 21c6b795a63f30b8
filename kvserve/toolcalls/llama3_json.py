"""Llama 3.x JSON calls: `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`),
several separated by `;`. There is no end marker: a block runs to the end of the output."""

from __future__ import annotations

import json

from kvserve.toolcalls.hermes import call_from_json
from kvserve.toolcalls.live import LiveView
from kvserve.toolcalls.live_json import live_json_call
from kvserve.toolcalls.syntax import JSON_ERRORS, ParamSchemas, ParsedCall, ParseResult

PYTHON_TAG = "<|python_tag|>"
tool_call_start = (PYTHON_TAG, '{"name"')
tool_call_end = None

_decoder = json.JSONDecoder()


def parse_tool_call(block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult:
    text = block.removeprefix(PYTHON_TAG)
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        pos = _skip_separators(text, pos)
        if pos == len(text):
            return calls or None
        try:
            value, pos = _decoder.raw_decode(text, pos)
        except JSON_ERRORS:
            return None
        parsed = call_from_json(value)
        if parsed is None:
            return None
        calls += parsed


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
        pos += 1
    return pos


def live_call(block: str, tools: ParamSchemas) -> LiveView | None:
    """The block's first call as far as it is certain (live_json.py)."""
    return live_json_call(block.removeprefix(PYTHON_TAG), 0)
