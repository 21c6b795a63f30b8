"""Syntax names -> modules, and the choice of a syntax from a chat template's text."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from kvserve.toolcalls import deepseek_dsml, glm, hermes, llama3_json, qwen3_coder
from kvserve.toolcalls.stream import ToolCallParser
from kvserve.toolcalls.syntax import ToolLike

SYNTAXES: dict[str, ModuleType] = {
    "hermes": hermes,
    "qwen3_coder": qwen3_coder,
    "glm": glm,
    "deepseek_dsml": deepseek_dsml,
    "llama3_json": llama3_json,
}
# What a model without a template (or with one that knows no tools) is prompted with: the per-family
# fallback renders Hermes-style `<tool_call>` blocks (SmolLM2's ChatML).
DEFAULT_SYNTAX = "hermes"


class UnknownToolParserError(ValueError):
    pass


def get_parser(name: str, tools: Iterable[ToolLike] = ()) -> ToolCallParser:
    """A fresh streaming parser (one per generation) for syntax `name`, typing values by `tools`."""
    syntax = SYNTAXES.get(name)
    if syntax is None:
        raise UnknownToolParserError(f"unknown tool parser {name!r}; choose one of {', '.join(SYNTAXES)}")
    return ToolCallParser(syntax, tools)  # type: ignore[arg-type]  # a module meets the ToolSyntax protocol


def detect_parser(chat_template: str | None) -> str:
    """The syntax a chat template teaches its model, from marker strings in the template's text.

    Order matters: Qwen3-Coder and GLM templates also contain `<tool_call>`, so their own markers are
    checked before Hermes'.
    """
    template = chat_template or ""
    if "DSML" in template:
        return "deepseek_dsml"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<arg_key>" in template:
        return "glm"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "tools" in template):
        return "llama3_json"
    return DEFAULT_SYNTAX
