"""Live argument streaming: the certain prefix of a call's compact arguments JSON while its block is open.

A syntax module may define `live_call(block, tools) -> LiveView | None`: the first call of an open block,
its name, and what of its arguments is already certain. The state machine (stream.py) sends what is new
as CallArgs, so a client sees the arguments as the model samples them. A prefix is certain only if the
block's final parse, whatever follows, serializes to text that starts with it: partial closing tags,
partial escapes and values whose form is not settled yet (typed values, numbers) are held back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserve.toolcalls.partial_json import close_json
from kvserve.toolcalls.syntax import coerce_value, compact_json, is_string_schema


@dataclass(frozen=True, slots=True)
class LiveView:
    name: str
    arguments: str  # a prefix of the call's final compact arguments JSON (without the closing `}`)


@dataclass(frozen=True, slots=True)
class LiveParam:
    """One parameter read so far. String values: `text` is the certain prefix (the whole value once
    `done`). Other values are sent only once `done`, typed by the schema like the final parse does."""

    key: str
    text: str
    done: bool
    is_string: bool = True
    value: Any = None  # the final value of a done parameter that is not a plain string


def held_tail(text: str, *markers: str) -> str:
    """`text` without its longest tail that is a proper prefix of one of `markers` (a partial tag or escape)."""
    cut = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), cut, -1):
            if text.endswith(marker[:n]):
                cut = n
                break
    return text[: len(text) - cut]


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def arguments_prefix(params: list[LiveParam]) -> str:
    """The certain prefix of `{"k":v,...}` for the parameters read so far (keys in order, like dicts)."""
    out = "{"
    seen: set[str] = set()
    for param in params:
        if param.key in seen:  # a repeated key rewrites an earlier value: nothing after it is certain
            return out
        seen.add(param.key)
        head = ("," if len(out) > 1 else "") + json.dumps(param.key, ensure_ascii=False) + ":"
        if not param.is_string:
            if not param.done:
                return out + head
            try:
                out += head + compact_json(param.value)
            except (ValueError, RecursionError):
                return out
            continue
        out += head + '"' + _escaped(param.text)
        if not param.done:
            return out
        out += '"'
    return out


def schema_param(key: str, raw: str, done: bool, schemas: Any) -> LiveParam:
    """A raw-text parameter (qwen3_coder, glm) typed by its schema the way `coerce_value` types it."""
    schema = schemas.get(key) if hasattr(schemas, "get") else None
    if is_string_schema(schema):
        return LiveParam(key, raw, done)
    return LiveParam(key, "", done, False, coerce_value(raw, schema) if done else None)


def closed_value(body: str, start: int, closer: str, nexts: tuple[str, ...]) -> tuple[str, bool, int]:
    """A value after `start` that closes at `closer` only when one of `nexts` (after whitespace) follows.

    Returns (certain raw text, whether it closed, position after the closer). A closer followed by the
    end of the text so far, or by a partial next tag, may still close the value: the text is held there.
    """
    search = start
    while (end := body.find(closer, search)) >= 0:
        after = end + len(closer)
        while after < len(body) and body[after].isspace():
            after += 1
        if body.startswith(nexts, after):
            return body[start:end], True, end + len(closer)
        rest = body[after:]
        if any(n.startswith(rest) for n in nexts):
            return body[start:end], False, -1
        search = end + 1
    return held_tail(body[start:], closer), False, -1


def closed_arguments(sent: str) -> str | None:
    """The shortest canonical compact JSON object that starts with `sent` (the arguments of a call whose
    block went malformed after they streamed): open strings and containers closed, a dangling `,` or
    key completed with null."""
    for extra in ("", "null", '"":null', ":null"):
        text = close_json(sent + extra)
        if not text.startswith(sent):
            continue
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and compact_json(value) == text:
            return text
    return None
