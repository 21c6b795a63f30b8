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


def with_reasoning(lark: str, open_tag: str, close_tag: str, is_open: bool) -> str:
    """`lark` preceded by a reasoning block, so a thinking model thinks before the forced output
    (which the output segmenter would otherwise read as reasoning). `is_open`: the prompt already
    opened the block, so it must be closed first; otherwise the model may open one, or not."""
    first, rest = lark.split("\n", 1)
    assert first.startswith("start: "), first
    block = "reasoning" if is_open else f"({literal(open_tag)} reasoning)"
    lead = f"{block} reasoning_ws?" if is_open else f"({block} reasoning_ws?)?"
    return (
        f"start: {lead} ({first.removeprefix('start: ')})\n{rest}"
        f"reasoning[lazy]: {lazy_text_until(close_tag)}\nreasoning_ws: /[ \\t\\n]+/\n"
    )
