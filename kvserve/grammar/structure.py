"""Structural greedy: inside a tool call, markup is sampled greedily, payload at the request's temperature.

A byte-level tracker per tool-call syntax (ds4's DSML decode tracker, generalized, ref §5.6), fed
every sampled token's bytes. Outside a call everything is free. Inside one:
  - JSON syntaxes (hermes, llama3_json): structural except the string values of the arguments (the
    call's "name" stays structural, so the tool name is the model's top choice).
  - XML-style syntaxes (qwen3_coder, glm, deepseek_dsml): structural except parameter value bodies; a
    partial closing tag (two or more bytes of it) is structural again, so a tag is finished greedily.
Pure Python, no tokenizer: `token_bytes` maps a token id to its bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.grammar.constraint import StructureTracker

__all__ = ["MarkupSpec", "MarkupTracker", "StructureTracker", "structure_tracker"]


@dataclass(frozen=True)
class MarkupSpec:
    opens: tuple[bytes, ...]  # markers that open a call region
    close: bytes | None  # the region's closer; None: the region ends with its JSON value
    is_json: bool
    value_open: bytes = (
        b""  # XML: a value body starts after this (after the tag's ">" when it ends in no ">")
    )
    value_close: bytes = b""


_D = "｜DSML｜".encode()
SPECS: dict[str, MarkupSpec] = {
    "hermes": MarkupSpec((b"<tool_call>",), b"</tool_call>", is_json=True),
    "llama3_json": MarkupSpec((b"<|python_tag|>", b'{"name"'), None, is_json=True),
    "qwen3_coder": MarkupSpec((b"<tool_call>",), b"</tool_call>", False, b"<parameter=", b"</parameter>"),
    "glm": MarkupSpec((b"<tool_call>",), b"</tool_call>", False, b"<arg_value>", b"</arg_value>"),
    "deepseek_dsml": MarkupSpec(
        (b"<" + _D + b"tool_calls>",),
        b"</" + _D + b"tool_calls>",
        False,
        b"<" + _D + b"parameter",
        b"</" + _D + b"parameter>",
    ),
}


class _State(enum.Enum):
    OUTSIDE = enum.auto()
    MARKUP = enum.auto()  # inside a call, between values
    OPEN_TAG = enum.auto()  # XML: inside a value's opening tag, up to its ">"
    VALUE = enum.auto()  # XML: a value body


class _JsonScanner:
    """Just enough of JSON to know whether the next byte is inside an argument's string value."""

    def __init__(self) -> None:
        self.stack: list[bytes] = []  # b"{" / b"["
        self.expect_key: list[bool] = []
        self.in_string = self.is_key = self.escaped = False
        self.key = bytearray()
        self.top_key = b""  # the last key read at depth 1
        self.started = False

    @property
    def is_done(self) -> bool:
        return self.started and not self.stack and not self.in_string

    @property
    def is_payload(self) -> bool:
        return self.in_string and not self.is_key and not (len(self.stack) == 1 and self.top_key == b"name")

    def feed(self, byte: int) -> None:
        if self.in_string:
            self._string_byte(byte)
        elif byte in b"{[":
            self.started = True
            self.stack.append(bytes([byte]))
            self.expect_key.append(byte == ord("{"))
        elif byte in b"}]" and self.stack:
            self.stack.pop()
            self.expect_key.pop()
        elif byte == ord('"'):
            self.in_string, self.escaped = True, False
            self.is_key = bool(self.stack) and self.stack[-1] == b"{" and self.expect_key[-1]
            self.key.clear()
        elif byte == ord(":") and self.expect_key:
            self.expect_key[-1] = False
        elif byte == ord(",") and self.stack:
            self.expect_key[-1] = self.stack[-1] == b"{"

    def _string_byte(self, byte: int) -> None:
        if self.escaped:
            self.escaped = False
        elif byte == ord("\\"):
            self.escaped = True
        elif byte == ord('"'):
            self.in_string = False
            if self.is_key and len(self.stack) == 1:
                self.top_key = bytes(self.key)
            return
        if self.is_key:
            self.key.append(byte)


class MarkupTracker:
    """A StructureTracker for one syntax."""

    def __init__(self, spec: MarkupSpec, token_bytes: Callable[[int], bytes]):
        self.spec = spec
        self._token_bytes = token_bytes
        self._tail_size = max(
            len(m) for m in (*spec.opens, spec.close or b"", spec.value_open, spec.value_close)
        )
        self.reset()

    def reset(self) -> None:
        self.state = _State.OUTSIDE
        self._tail = bytearray()
        self._json: _JsonScanner | None = None

    @property
    def is_structural(self) -> bool:
        if self.state == _State.OUTSIDE:
            return False
        if self.state == _State.VALUE:
            return self._partial_close()
        return not (self._json is not None and self._json.is_payload)

    def feed_token(self, token_id: int) -> None:
        for byte in self._token_bytes(token_id):
            self._feed(byte)

    def _feed(self, byte: int) -> None:
        self._tail.append(byte)
        del self._tail[: -self._tail_size]
        tail = bytes(self._tail)
        if self.state == _State.OUTSIDE:
            opened = next((m for m in self.spec.opens if tail.endswith(m)), None)
            if opened is not None:
                self._enter(opened)
        elif self._closes(tail):
            self.reset()
        elif self.spec.is_json:
            self._json_byte(byte)
        else:
            self._xml_byte(byte, tail)

    def _closes(self, tail: bytes) -> bool:
        if self.spec.close is None or self.state != _State.MARKUP:
            return False
        return tail.endswith(self.spec.close) and not (self._json is not None and self._json.in_string)

    def _enter(self, marker: bytes) -> None:
        self.state, self._tail = _State.MARKUP, bytearray()
        if self.spec.is_json:
            self._json = _JsonScanner()
            if marker.startswith(b"{"):  # llama3_json: the marker is the start of the call's JSON
                for byte in marker:
                    self._json.feed(byte)

    def _json_byte(self, byte: int) -> None:
        assert self._json is not None
        self._json.feed(byte)
        if self._json.is_done and self.spec.close is None:
            self.reset()

    def _xml_byte(self, byte: int, tail: bytes) -> None:
        spec = self.spec
        if self.state == _State.MARKUP and tail.endswith(spec.value_open):
            self.state = _State.VALUE if spec.value_open.endswith(b">") else _State.OPEN_TAG
            self._tail = bytearray()
        elif self.state == _State.OPEN_TAG and byte == ord(">"):
            self.state, self._tail = _State.VALUE, bytearray()
        elif self.state == _State.VALUE and tail.endswith(spec.value_close):
            self.state, self._tail = _State.MARKUP, bytearray()

    def _partial_close(self) -> bool:
        """The value ends with two or more bytes of its closing tag: finish the tag greedily."""
        close, tail = self.spec.value_close, bytes(self._tail)
        return any(tail.endswith(close[:n]) for n in range(2, len(close)))


def structure_tracker(syntax: str, token_bytes: Callable[[int], bytes]) -> MarkupTracker | None:
    spec = SPECS.get(syntax)
    return None if spec is None else MarkupTracker(spec, token_bytes)
