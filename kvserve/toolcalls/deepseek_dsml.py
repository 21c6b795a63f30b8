"""DeepSeek DSML calls (the reference's format, ref §5.2-5.3):

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

Also the "short" spelling with the first bar missing (`<DSML｜invoke …>`) and plain XML (`<invoke …>`).
String values are raw text; the only escape is `&lt;/｜DSML｜parameter>` for the closing tag itself.
A parameter without `string` whose body starts with a parameter is a nested object of those parameters.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from kvserve.toolcalls.live import LiveParam, LiveView, arguments_prefix, held_tail
from kvserve.toolcalls.partial_json import loads_repaired
from kvserve.toolcalls.syntax import JSON_ERRORS, NEEDS_MORE, ParamSchemas, ParsedCall, ParseResult
from kvserve.toolcalls.xml_scan import is_partial, skip_ws, strip_partial

_PREFIXES = ("｜DSML｜", "DSML｜", "")  # full, short, plain
tool_call_start = tuple(f"<{p}tool_calls>" for p in _PREFIXES)
tool_call_end = tuple(f"</{p}tool_calls>" for p in _PREFIXES)

_ATTRS = re.compile(r'(?:\s+[\w-]+="[^"]*")*\s*')
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')


class _Cut(Exception):
    """The block ended inside an element."""


def parse_tool_call(block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult:
    k = next(i for i, start in enumerate(tool_call_start) if block.startswith(start))
    body = block[len(tool_call_start[k]) :]
    end = tool_call_end[k]
    body = strip_partial(body, end) if is_truncated else body.removesuffix(end)
    parser = _BlockParser(body, _PREFIXES[k], is_truncated)
    try:
        parser.parse()
    except _Cut:
        if not is_truncated:
            return NEEDS_MORE
    except JSON_ERRORS:  # any deviation from the grammar (or absurd nesting): the block is returned as text
        return None
    return parser.calls or None


class _BlockParser:
    """Recursive descent over one block body. Calls and argument dicts are filled as they are read,
    so a block cut short (is_truncated) keeps everything before the cut: the open tags are closed."""

    def __init__(self, text: str, prefix: str, is_truncated: bool):
        self.text, self.pos, self.is_truncated = text, 0, is_truncated
        self.invoke, self.invoke_end = f"<{prefix}invoke", f"</{prefix}invoke>"
        self.param, self.param_end = f"<{prefix}parameter", f"</{prefix}parameter>"
        self.escaped_end = f"&lt;/{prefix}parameter>"
        self.calls: list[ParsedCall] = []

    def parse(self) -> None:
        while (pos := skip_ws(self.text, self.pos)) < len(self.text):
            self.pos = pos
            self._expect(self.invoke)
            attrs = self._open_tag(self.invoke)
            args: dict[str, Any] = {}
            self.calls.append(ParsedCall(_required(attrs, "name"), args))
            self._params(args, self.invoke_end)

    def _params(self, into: dict[str, Any], closer: str) -> None:
        while True:
            self.pos = skip_ws(self.text, self.pos)
            if self.text.startswith(closer, self.pos):
                self.pos += len(closer)
                return
            if self.pos == len(self.text):
                raise _Cut
            self._expect(self.param, closer)
            self._param(into)

    def _param(self, into: dict[str, Any]) -> None:
        attrs = self._open_tag(self.param)
        name, kind = _required(attrs, "name"), attrs.get("string")
        if kind is None and self.text.startswith(self.param, skip_ws(self.text, self.pos)):
            into[name] = nested = {}
            self._params(nested, self.param_end)
            return
        end = self.text.find(self.param_end, self.pos)
        if end < 0:
            if self.is_truncated:
                into[name] = self._value(strip_partial(self.text[self.pos :], self.param_end), kind)
            raise _Cut
        into[name] = self._value(self.text[self.pos : end], kind)
        self.pos = end + len(self.param_end)

    def _value(self, raw: str, kind: str | None) -> Any:
        if kind != "false":
            return raw.replace(self.escaped_end, self.param_end)
        try:
            return json.loads(raw)
        except JSON_ERRORS:
            repaired = loads_repaired(raw) if self.is_truncated else None
            # Not JSON after all: keep the model's text rather than dropping the argument.
            return repaired if repaired is not None else raw

    def _expect(self, tag: str, *alternatives: str) -> None:
        if self.text.startswith(tag, self.pos):
            return
        if self.is_truncated and is_partial(self.text[self.pos :], tag, *alternatives):
            raise _Cut
        raise ValueError(f"expected {tag!r} at {self.pos}")

    def _open_tag(self, tag: str) -> dict[str, str]:
        close = self.text.find(">", self.pos)
        if close < 0:
            raise _Cut
        attrs = self.text[self.pos + len(tag) : close]
        if not _ATTRS.fullmatch(attrs):
            raise ValueError(f"bad attributes {attrs!r}")
        self.pos = close + 1
        return {key: html.unescape(value) for key, value in _ATTR.findall(attrs)}


def _required(attrs: dict[str, str], key: str) -> str:
    if not attrs.get(key):
        raise ValueError(f"missing {key}=")
    return attrs[key]


def live_call(block: str, tools: ParamSchemas) -> LiveView | None:
    """The open block's first invoke as far as it is certain (see live.py); None before its name."""
    k = next(i for i, start in enumerate(tool_call_start) if block.startswith(start))
    prefix = _PREFIXES[k]
    text = block[len(tool_call_start[k]) :]
    invoke, param = f"<{prefix}invoke", f"<{prefix}parameter"
    param_end, escaped_end = f"</{prefix}parameter>", f"&lt;/{prefix}parameter>"
    pos = skip_ws(text, 0)
    attrs = _live_tag(text, pos, invoke)
    if attrs is None or not attrs[0].get("name"):
        return None
    name, pos = attrs[0]["name"], attrs[1]
    params: list[LiveParam] = []
    while True:
        pos = skip_ws(text, pos)
        opened = _live_tag(text, pos, param)
        if opened is None or not opened[0].get("name"):
            break
        pos, key, kind = opened[1], opened[0]["name"], opened[0].get("string")
        end = text.find(param_end, pos)
        raw = text[pos:] if end < 0 else text[pos:end]
        stripped = raw.lstrip()
        if kind is None and (stripped.startswith(param) or (end < 0 and param.startswith(stripped))):
            break  # (maybe) a nested object: held whole until the block closes
        if kind == "false":
            if end >= 0:
                params.append(LiveParam(key, "", True, False, _live_json(raw)))
                pos = end + len(param_end)
                continue
            params.append(LiveParam(key, "", False, False))
            break
        if end < 0:
            raw = held_tail(raw, param_end, escaped_end)
        params.append(LiveParam(key, raw.replace(escaped_end, param_end), end >= 0))
        if end < 0:
            break
        pos = end + len(param_end)
    return LiveView(name, arguments_prefix(params))


def _live_tag(text: str, pos: int, tag: str) -> tuple[dict[str, str], int] | None:
    """A complete, well-formed opening `tag` at `pos`: its attributes and the position after it."""
    if not text.startswith(tag, pos):
        return None
    close = text.find(">", pos)
    if close < 0 or not _ATTRS.fullmatch(text[pos + len(tag) : close]):
        return None
    attrs = {key: html.unescape(value) for key, value in _ATTR.findall(text[pos + len(tag) : close])}
    return attrs, close + 1


def _live_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except JSON_ERRORS:
        return raw
