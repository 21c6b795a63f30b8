"""Live streaming for the JSON syntaxes (hermes, llama3_json): `{"name": "f", "arguments": {...}}`.

Once the name and the opening `{` of the arguments are read, the arguments text is re-serialized
compactly (the form CallEnd.arguments takes) as far as it is certain: whitespace dropped, strings
decoded and re-escaped the way json.dumps writes them (a cut escape is held), numbers and literals
sent only once complete (`1.0e2` becomes `100.0` only when the number ends).
"""

from __future__ import annotations

import json
import re

from kvserve.toolcalls.live import LiveView
from kvserve.toolcalls.syntax import JSON_ERRORS, compact_json
from kvserve.toolcalls.xml_scan import skip_ws

_decoder = json.JSONDecoder()
_ATOM = re.compile(r'[^\s,:\[\]{}"]+')
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}(?:\\u[0-9a-fA-F]{4})?|[^u])")
_CANONICAL_ATOM = re.compile(r"0|-?[1-9][0-9]*|true|false|null")
_PLAIN = re.compile(r'[^"\\]+')
_ARGUMENT_KEYS = ("arguments", "parameters")


def live_json_call(text: str, pos: int) -> LiveView | None:
    """The call object at `pos`, when it starts `{"name": "...", "arguments": {` (else None: held)."""
    pos = skip_ws(text, pos)
    if not text.startswith("{", pos):
        return None
    try:
        key, pos = _decoder.raw_decode(text, skip_ws(text, pos + 1))
        pos = _colon(text, pos)
        name, pos = _decoder.raw_decode(text, pos)
        pos = skip_ws(text, pos)
        if not text.startswith(",", pos):
            return None
        arguments_key, pos = _decoder.raw_decode(text, skip_ws(text, pos + 1))
        pos = _colon(text, pos)
    except JSON_ERRORS:
        return None
    if key != "name" or not isinstance(name, str) or not name or arguments_key not in _ARGUMENT_KEYS:
        return None
    if not text.startswith("{", pos):
        return None
    return LiveView(name, compact_prefix(text, pos))


def _colon(text: str, pos: int) -> int:
    pos = skip_ws(text, pos)
    if not text.startswith(":", pos):
        raise ValueError("expected ':'")
    return skip_ws(text, pos + 1)


def compact_prefix(text: str, pos: int) -> str:
    """The certain compact form of the JSON value at `pos`, up to where it ends or the text is cut."""
    out: list[str] = []
    depth = 0
    while pos < len(text):
        ch = text[pos]
        if ch.isspace():
            pos += 1
        elif ch in "{[,:}]":
            out.append(ch)
            pos += 1
            depth += (ch in "{[") - (ch in "}]")
            if depth <= 0:
                break
        elif ch == '"':
            piece, pos = _string(text, pos)
            out.append(piece)
            if pos < 0:
                break
        else:
            match = _ATOM.match(text, pos)
            assert match is not None
            if match.end() == len(text):  # the number may go on
                break
            atom = match.group()
            if not _CANONICAL_ATOM.fullmatch(atom):  # (the common case needs no round trip)
                try:
                    atom = compact_json(json.loads(atom))
                except JSON_ERRORS:
                    break  # not JSON: the block will not parse; stop here
            out.append(atom)
            pos = match.end()
    return "".join(out)


def _string(text: str, pos: int) -> tuple[str, int]:
    """The string at `pos` re-escaped: (its compact text, the position after it), or (the certain
    part, -1) when it is cut or malformed."""
    parts: list[str] = []
    i = pos + 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return '"' + _escaped("".join(parts)) + '"', i + 1
        if ch != "\\":
            run = _PLAIN.match(text, i)
            assert run is not None
            parts.append(run.group())
            i = run.end()
            continue
        match = _ESCAPE.match(text, i)
        # A `\u` escape needs its 4 digits, and a high surrogate its low half, before it is certain.
        if match is None or (match.group().startswith("\\u") and _cut_surrogate(text, match)):
            break
        try:
            parts.append(json.loads('"' + match.group() + '"'))
        except JSON_ERRORS:
            break
        i = match.end()
    return '"' + _escaped("".join(parts)), -1


def _cut_surrogate(text: str, match: re.Match[str]) -> bool:
    code = int(match.group()[2:6], 16)
    return 0xD800 <= code < 0xDC00 and len(match.group()) == 6 and len(text) - match.end() < 6


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]
