"""Hermes-style tool prompting for chat templates that cannot render tools (SmolLM2's ChatML).

The conversation is rewritten before the template sees it, the way Qwen2.5/Hermes templates render
tools themselves: the tool schemas and the call format go into the first system message (created if
absent), history calls become `<tool_call>` blocks in the assistant's text (what the `hermes` parser
reads back), and tool results become user turns of `<tool_response>` blocks (ChatML templates such as
SmolLM2's know no tool role). Everything is canonical JSON (chat/tools.py), so semantically equal
requests give byte-identical prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.chat.conversation import Message, Part, TextPart, ToolCallPart, ToolResultPart, ToolSpec
from kvserve.chat.tools import canonical_json, canonical_json_text, tool_schema_text

TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
)
CALL_INSTRUCTION = (
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tools_system_block(tools: Sequence[ToolSpec]) -> str:
    """The system-prompt section offering `tools`: one canonical schema per line inside <tools>."""
    schemas = "\n".join(tool_schema_text(t) for t in tools)
    return f"{TOOLS_PREAMBLE}<tools>\n{schemas}\n</tools>\n\n{CALL_INSTRUCTION}"


def tool_call_text(call: ToolCallPart) -> str:
    """One history call as the model is taught to write it (and the hermes parser reads it)."""
    arguments = canonical_json_text(call.arguments) if call.arguments.strip() else "{}"
    return f'<tool_call>\n{{"name": {canonical_json(call.name)}, "arguments": {arguments}}}\n</tool_call>'


def tool_response_text(content: str) -> str:
    """A result inside <tool_response>; only its own closer is escaped, so code reaches the model as is."""
    escaped = content.replace("</tool_response>", "&lt;/tool_response>")
    return f"<tool_response>\n{escaped}\n</tool_response>"


def needs_rewrite(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> bool:
    return bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)


def hermes_messages(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> tuple[Message, ...]:
    """`messages` rewritten for a template without tool support; unchanged (same objects) when there
    are no tools and no tool calls or results in the history."""
    if not needs_rewrite(messages, tools):
        return tuple(messages)
    out: list[Message] = []
    responses: list[Part] = []  # consecutive tool results (and their images), flushed as one user turn
    for message in messages:
        if message.role == "tool":
            separator = (TextPart("\n"),) if responses else ()
            responses += [*separator, TextPart(tool_response_text(_result_text(message))), *message.images]
            continue
        if responses:
            out.append(Message("user", tuple(responses)))
            responses = []
        out.append(
            _with_call_text(message) if message.role == "assistant" and message.tool_calls else message
        )
    if responses:
        out.append(Message("user", tuple(responses)))
    if tools:
        block = tools_system_block(tools)
        if out and out[0].role == "system":
            separator = "\n\n" if out[0].text else ""
            out[0] = Message("system", (*out[0].parts, TextPart(separator + block)))
        else:
            out.insert(0, Message("system", (TextPart(block),)))
    return tuple(out)


def _with_call_text(message: Message) -> Message:
    """The calls written into the assistant's text: the exact sampled bytes when tool replay memory
    knows them (they carry their own leading whitespace), else canonical Hermes blocks."""
    if message.replay is not None:
        calls, separator = message.replay, ""
    else:
        calls = "\n".join(tool_call_text(c) for c in message.tool_calls)
        separator = "\n" if message.text else ""
    kept = tuple(p for p in message.parts if not isinstance(p, ToolCallPart))
    return Message("assistant", (*kept, TextPart(separator + calls)))


def _result_text(message: Message) -> str:
    return message.text + "".join(p.content for p in message.parts if isinstance(p, ToolResultPart))
