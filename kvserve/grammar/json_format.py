"""The grammar of `response_format` / `text.format`: JSON, valid against a schema when one is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvserve.grammar.lark import json_lexeme

ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


def json_grammar(schema: Mapping[str, Any] | None) -> str:
    """`schema` None: any JSON object (OpenAI's json_object mode)."""
    return f"start: value\nvalue: {json_lexeme(ANY_OBJECT if schema is None else schema)}\n"
