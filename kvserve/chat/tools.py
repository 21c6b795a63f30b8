"""Tool schemas from each API's wire shape -> ToolSpec, and their canonical JSON text.

Canonical rendering is what makes a prompt a pure function of the request's meaning: two clients that
send the same schema with different whitespace or `\\u` escapes get byte-identical prompts, so the
second one hits the KV cache. Key order is the client's (it is meaningful to the model and stable).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kvserve.chat.conversation import NAMESPACE_SEPARATOR, ToolSpec

# Anthropic tools with a `type` other than these are hosted (web_search_…, bash_…): Anthropic runs them.
_ANTHROPIC_CLIENT_TYPES = (None, "custom")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class ToolSchemaError(ValueError):
    """A tool definition the model cannot be offered; `param` is the body path, for a 400."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def canonical_json(value: Any) -> str:
    """Python's default separators (`", "`, `": "`), insertion order, decoded UTF-8. A lone surrogate
    (legal in JSON text, not in UTF-8) stays a `\\uXXXX` escape so the prompt can be encoded."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def canonical_json_text(text: str) -> str:
    """JSON text (tool-call arguments as a client replays them) in canonical form; text that is not
    JSON is returned unchanged (it is rendered as the model wrote it)."""
    try:
        return canonical_json(json.loads(text))
    except ValueError:
        return text


def canonical_tool(spec: ToolSpec) -> ToolSpec:
    """The spec with parameters round-tripped through JSON (plain dicts/lists, nothing else)."""
    return dataclasses.replace(spec, parameters=json.loads(canonical_json(spec.parameters)))


def tool_schema_text(spec: ToolSpec) -> str:
    """One tool as one line of canonical JSON, in OpenAI's function shape (for fallback prompts)."""
    function = {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
    return canonical_json({"type": "function", "function": function})


# -- wire shapes -> ToolSpec ------------------------------------------------------------------


def tools_from_openai(tools: Iterable[Mapping[str, Any]], param: str = "tools") -> tuple[ToolSpec, ...]:
    """Chat Completions: `{"type": "function", "function": {name, description, parameters}}`."""
    specs = []
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") == "function" and isinstance(function, Mapping):
            specs.append(_spec(function, "parameters", f"{param}.{i}.function"))
    return tuple(specs)


def tools_from_anthropic(tools: Iterable[Mapping[str, Any]], param: str = "tools") -> tuple[ToolSpec, ...]:
    """Messages: `{name, description, input_schema}`; hosted tools are skipped."""
    return tuple(
        _spec(tool, "input_schema", f"{param}.{i}")
        for i, tool in enumerate(tools)
        if tool.get("type") in _ANTHROPIC_CLIENT_TYPES
    )


def tools_from_responses(tools: Iterable[Mapping[str, Any]], param: str = "tools") -> tuple[ToolSpec, ...]:
    """Responses: flat function tools; namespace tools flattened to `ns__name`; custom (free-text)
    tools as one string parameter `input`; hosted tools (web_search, …) skipped."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            specs.append(_spec(tool, "parameters", f"{param}.{i}"))
        elif kind == "custom":
            specs.append(_custom_spec(tool, f"{param}.{i}"))
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not namespace:
                raise ToolSchemaError("a namespace tool needs a non-empty name", f"{param}.{i}.name")
            for k, inner in enumerate(tool.get("tools") or ()):
                if isinstance(inner, Mapping) and inner.get("type", "function") == "function":
                    spec = _spec(inner, "parameters", f"{param}.{i}.tools.{k}")
                    name = flat_tool_name(namespace, spec.name)
                    specs.append(dataclasses.replace(spec, name=name, namespace=namespace))
    return tuple(specs)


def flat_tool_name(namespace: str, name: str) -> str:
    """The stable prompt-side name of tool `name` inside a Responses namespace tool."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def split_tool_name(name: str, tools: Iterable[ToolSpec]) -> tuple[str | None, str]:
    """A name the model wrote -> (namespace, the client's name): the inverse of flat_tool_name for
    the tools offered; names of other tools come back unchanged with no namespace."""
    for spec in tools:
        if spec.name == name and spec.namespace is not None:
            return spec.namespace, spec.wire_name
    return None, name


def _spec(tool: Mapping[str, Any], schema_key: str, param: str) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(f"{param}.name must be a non-empty string", f"{param}.name")
    schema = tool.get(schema_key)
    if schema is None:
        schema = {"type": "object", "properties": {}}
    elif not isinstance(schema, Mapping):
        raise ToolSchemaError(f"{param}.{schema_key} must be a JSON object", f"{param}.{schema_key}")
    description = tool.get("description")
    strict = tool.get("strict")
    return canonical_tool(
        ToolSpec(
            name,
            description if isinstance(description, str) else "",
            dict(schema),
            strict=strict if isinstance(strict, bool) else None,
        )
    )


def _custom_spec(tool: Mapping[str, Any], param: str) -> ToolSpec:
    """A free-text tool (Codex's apply_patch): the model passes its text as the `input` argument,
    the shape kvserve/api/openai_responses/adapter.py gives custom tool calls in history."""
    spec = _spec({**tool, "parameters": None}, "parameters", param)
    parameters = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    return dataclasses.replace(spec, parameters=parameters, kind="custom")
