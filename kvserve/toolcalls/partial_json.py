"""Repair of JSON cut off mid-way (a call truncated by max_tokens): close what is open, in reverse order."""

from __future__ import annotations

import json
from typing import Any

_CLOSER = {"{": "}", "[": "]"}


def close_json(text: str) -> str:
    """`text` with an open string, then open arrays/objects, closed. A dangling `,` is dropped and a
    dangling `:` gets `null`, so `{"a": [1, 2` -> `{"a": [1, 2]}`. The result may still be invalid JSON
    (a cut literal like `tru`); callers parse it and give up then."""
    stack: list[str] = []
    in_string = False
    escaped = False
    string_start = 0
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string, string_start = True, i
        elif ch in _CLOSER:
            stack.append(_CLOSER[ch])
        elif ch in "}]" and stack:
            stack.pop()
    if in_string:
        body = text[string_start:]
        # A cut escape (`\` or `\u12`) cannot be completed; drop it.
        cut = body.rfind("\\")
        if cut >= 0 and (escaped or (body[cut + 1 : cut + 2] == "u" and len(body) - cut < 6)):
            text = text[: string_start + cut]
        text += '"'
    else:
        text = text.rstrip()
        if text.endswith(","):
            text = text[:-1]
        elif text.endswith(":"):
            text += " null"
    return text + "".join(reversed(stack))


def loads_repaired(text: str) -> Any | None:
    """json.loads of `text` closed by close_json; None when even that is not JSON."""
    try:
        return json.loads(close_json(text))
    except (ValueError, RecursionError):  # deep nesting raises the latter
        return None
