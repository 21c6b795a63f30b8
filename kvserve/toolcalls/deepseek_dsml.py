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
