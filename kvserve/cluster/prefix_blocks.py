"""The router's approximate view of a prompt: chain hashes of fixed-size blocks of its content.

The engine's block hashes are over token ids, which the router cannot have without rendering and
tokenizing every request (the replica's work). It hashes what it can see instead: the parts of the
body that become the prompt, in prompt order, serialized canonically and cut into `BLOCK_BYTES`
blocks. A later turn that appends messages (or a longer completion prompt) starts with the same
bytes, so it starts with the same block hashes; that is all the prefix match needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import xxhash

BLOCK_BYTES = 1024
# Parts of Anthropic's system prompt that change on every request (Claude Code's billing header): the
# replica leaves them out of the prompt (api/anthropic_messages/adapter.py), and so does the router.
_PRIVATE_SYSTEM_PREFIX = "x-anthropic-"
# Markers that move from turn to turn without changing the prompt (Anthropic's cache breakpoints).
_VOLATILE_KEYS = frozenset({"cache_control"})


def prompt_units(path: str, body: dict[str, Any]) -> list[Any]:
    """What of `body` the model sees, in prompt order, for each generation route; [] for others."""
    if path == "/v1/messages":
        return [_system(body.get("system")), body.get("tools"), *_list(body.get("messages"))]
    if path == "/v1/chat/completions":
        return [body.get("tools"), *_list(body.get("messages"))]
    if path == "/v1/responses":
        items = body.get("input")
        return [
            body.get("instructions"),
            body.get("tools"),
            *(_list(items) if isinstance(items, list) else [items]),
        ]
    if path == "/v1/completions":
        prompt = body.get("prompt")
        return [prompt] if isinstance(prompt, str) else []
    return []


def block_hashes(units: Iterable[Any], block_bytes: int = BLOCK_BYTES) -> tuple[int, ...]:
    """Chain hashes of the full `block_bytes` blocks of the units' canonical bytes: block i's hash
    covers blocks 0..i, so equal hashes mean equal prefixes."""
    data = b"".join(_canonical(unit) for unit in units)
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = xxhash.xxh64_intdigest(data[start : start + block_bytes], seed=parent)
        hashes.append(parent)
    return tuple(hashes)


def _canonical(unit: Any) -> bytes:
    """One unit's bytes: a string as is, anything else as sorted compact JSON without the volatile
    keys; newline-terminated, so that units never run into each other."""
    if unit is None:
        return b"\n"
    if isinstance(unit, str):
        return unit.encode() + b"\n"
    text = json.dumps(_without_volatile(unit), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text.encode() + b"\n"


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in _VOLATILE_KEYS}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def _system(system: Any) -> Any:
    if isinstance(system, list):
        return [
            block
            for block in system
            if not (isinstance(block, dict) and str(block.get("text", "")).startswith(_PRIVATE_SYSTEM_PREFIX))
        ]
    return system


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
