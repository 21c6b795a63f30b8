"""The contract every syntax module meets, and helpers they share.

A syntax module defines three symbols (mlx-lm style):
  tool_call_start: str | tuple[str, ...]   markers that open a block
  tool_call_end:   str | tuple[str, ...] | None   the matching closers, paired by position
                   (None: a block runs to the end of the output)
  parse_tool_call(block, tools, is_truncated) -> list[ParsedCall] | None | NeedsMore
The shared state machine (`stream.py`) finds blocks; the module only parses one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


class NeedsMore:
    """Returned when an end marker closed the block too early (the marker text sat inside a value):
    the machine keeps reading up to the next end marker. Never returned with is_truncated=True."""


NEEDS_MORE: Final = NeedsMore()

# json raises RecursionError, not ValueError, on deep nesting; model output may nest arbitrarily.
JSON_ERRORS: Final = (ValueError, RecursionError)

ParseResult = list[ParsedCall] | None | NeedsMore


class ToolLike(Protocol):
    """Anything with a name and a JSON-schema `parameters` (chat.conversation.ToolSpec fits)."""

    @property
    def name(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...


# tool name -> parameter name -> that parameter's JSON schema
ParamSchemas = Mapping[str, Mapping[str, Any]]


def param_schemas(tools: Iterable[ToolLike]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        props = tool.parameters.get("properties") if isinstance(tool.parameters, Mapping) else None
        out[tool.name] = dict(props) if isinstance(props, Mapping) else {}
    return out


def compact_json(value: Any) -> str:
    """Client-facing arguments: compact, key order as generated, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows ("any" when it constrains values only by an enum of non-strings)."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types = {kind}
    elif isinstance(kind, list):
        types = {t for t in kind if isinstance(t, str)}
    else:
        types = set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types |= _schema_types(option)
    if not types and isinstance(schema.get("enum"), list):
        types = {"string"} if all(isinstance(v, str) for v in schema["enum"]) else {"any"}
    return types


def is_string_schema(schema: Any) -> bool:
    """Whether `coerce_value` keeps a value written under `schema` as its raw text."""
    types = _schema_types(schema)
    return not types or "string" in types


def coerce_value(raw: str, schema: Any) -> Any:
    """A parameter written as raw text (XML-ish syntaxes) -> a JSON value, typed by its schema.

    Strings stay raw (no quoting games); a value that does not parse as its declared type stays a string
    rather than failing the call. Unknown parameters are strings: that is how these templates render them.
    """
    if is_string_schema(schema):
        return raw
    types = _schema_types(schema)
    text = raw.strip()
    try:
        value = json.loads(text)
    except JSON_ERRORS:
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
        return raw
    if "integer" in types and isinstance(value, float) and value.is_integer() and "number" not in types:
        return int(value)
    return value
