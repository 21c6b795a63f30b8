"""The agent's messages and tools as OpenAI Chat Completions and Anthropic Messages request bodies."""

from __future__ import annotations

import json
from typing import Any

from kvserve.agent.events import ModelRequest
from kvserve.agent.messages import Message

# Anthropic needs a thinking budget where OpenAI takes an effort name.
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 32768, "max": 65536}


def openai_body(request: ModelRequest, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [_openai_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": request.max_tokens,
    }
    if request.tools:
        body["tools"] = [
            {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
            for n, d, p in request.tools
        ]
    if request.tool_choice:
        body["tool_choice"] = request.tool_choice
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    if request.extension:
        body["kvserve"] = request.extension
    return body


def _openai_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        content: Any = message.content
        if message.image:
            content = [
                {"type": "text", "text": message.content},
                {"type": "image_url", "image_url": {"url": message.image}},
            ]
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["content"] = message.content or None
        wire["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return wire


def anthropic_body(request: ModelRequest, model: str) -> dict[str, Any]:
    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "messages": _anthropic_messages([m for m in request.messages if m.role != "system"]),
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": n, "description": d, "input_schema": p} for n, d, p in request.tools]
    if request.tool_choice == "none":
        body["tool_choice"] = {"type": "none"}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.reasoning_effort == "none":
        body["thinking"] = {"type": "disabled"}
    elif request.reasoning_effort is not None:
        budget = min(THINKING_BUDGETS.get(request.reasoning_effort, 8192), max(request.max_tokens - 1, 1024))
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if request.extension:
        body["kvserve"] = request.extension
    return body


def _anthropic_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Tool results become `tool_result` blocks of a user turn; consecutive user blocks merge."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _anthropic_blocks(message)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _anthropic_blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        content: Any = message.content
        if message.image:
            media_type, _, data = message.image.removeprefix("data:").partition(";base64,")
            source = {"type": "base64", "media_type": media_type, "data": data}
            content = [{"type": "text", "text": message.content}, {"type": "image", "source": source}]
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": content}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    for call in message.tool_calls:
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.call_id, "name": call.name, "input": arguments})
    if not blocks:
        blocks.append({"type": "text", "text": "(empty)" if message.role == "assistant" else " "})
    return blocks
