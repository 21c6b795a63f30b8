"""What the tool-replay tests share: the assistant turn a Chat Completions client sends back with
its call's arguments re-serialized, and how much of the previous turn can be cached."""

from __future__ import annotations

from typing import Any


def chat_call_turn(call: Any, arguments: str) -> dict[str, Any]:
    """The assistant turn resent with `call` (an SDK tool call), its arguments as the client wrote them."""
    function = {"name": call.function.name, "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": function}]}  # fmt: skip


def whole_turn(prompt_tokens: int, output_tokens: int, block: int) -> int:
    """Tokens of the previous turn whose KV exists, in whole blocks (its last sampled token was
    never fed back through the model)."""
    return (prompt_tokens + output_tokens - 1) // block * block
