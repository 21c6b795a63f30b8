"""Strict JSON body parsing: the client's mistakes become ApiErrors, never a 500.

Python's json accepts NaN/Infinity and lone surrogate escapes and recurses without a
bound we choose; we reject the first, repair the second (U+FFFD) and cap nesting at 256.
Duplicate keys: the last value wins (json's behaviour, and the reference's).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvserve.api.errors import ApiError

MAX_NESTING = 256
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    raise ApiError(400, f"invalid JSON: {name} is not a valid JSON number")


def parse_json_body(body: bytes) -> Any:
    if not body.strip():
        raise ApiError(400, "the request body is empty; expected a JSON object")
    text = body.decode("utf-8", errors="replace")  # invalid UTF-8 bytes become U+FFFD
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, f"invalid JSON: nesting deeper than {MAX_NESTING}") from None
    except ValueError as error:
        raise ApiError(400, f"invalid JSON: {error}") from None
    value = _check_and_repair(value)
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


def _check_and_repair(root: Any) -> Any:
    """Iterative walk: enforce the nesting limit and replace lone surrogates in strings and keys."""
    root_box = [root]
    stack: list[tuple[Any, int]] = [(root_box, 0)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ApiError(400, f"invalid JSON: nesting deeper than {MAX_NESTING}")
        if isinstance(container, dict):
            if any(_LONE_SURROGATE.search(k) for k in container):
                repaired = {_LONE_SURROGATE.sub("\ufffd", k): v for k, v in container.items()}
                container.clear()
                container.update(repaired)
            items = container.items()
        else:
            items = enumerate(container)
        for key, child in list(items):
            if isinstance(child, str):
                if _LONE_SURROGATE.search(child):
                    container[key] = _LONE_SURROGATE.sub("\ufffd", child)
            elif isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return root_box[0]
