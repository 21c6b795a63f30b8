"""Small helpers that write llguidance's Lark dialect (docs: llguidance/docs/syntax.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# How JSON is written inside the grammars: the separators of the canonical rendering (", " / ": ",
# chat/tools.py) that the templates and the Hermes fallback teach, and no other whitespace.
PROMPT_SEPARATORS = (", ", ": ")
COMPACT_SEPARATORS = (",", ":")  # DSML's minified JSON values

_REGEX_SPECIAL = set("\\.^$|?*+()[]{}/")


def literal(text: str) -> str:
    """A Lark string literal matching `text` exactly (UTF-8 kept, control characters escaped)."""
    return json.dumps(text, ensure_ascii=False)


def regex_literal(text: str) -> str:
    """`text` escaped for use inside a Lark `/.../` regex."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text).replace("\n", "\\n")


def json_lexeme(schema: Mapping[str, Any], separators: tuple[str, str] = PROMPT_SEPARATORS) -> str:
    """`%json {...}`: JSON valid against `schema`, written with `separators` and no other whitespace.

    `lenient`: keywords llguidance does not implement (formats, for instance) are ignored rather than
    failing the grammar, so any client schema compiles; the structure is still enforced.
    """
    options = {
        "item_separator": separators[0],
        "key_separator": separators[1],
        "whitespace_flexible": False,
        "lenient": True,
    }
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def lazy_text_until(closer: str) -> str:
    """A lexeme of any text up to and including the first `closer` (the value cannot contain it)."""
    return f"/(.|\\n)*{regex_literal(closer)}/"
