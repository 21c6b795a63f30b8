"""Reasoning markup per model family, and its detection from a chat template's text."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningSyntax:
    """`open`/`close` delimit the reasoning block; `opens_in_prompt` is true when the template's
    generation prompt already writes `open`, so the output starts inside the block (DeepSeek V3.1+/V4,
    Qwen3 "thinking-2507") and only `close` is ever sampled."""

    name: str
    open: str
    close: str
    opens_in_prompt: bool = False


SYNTAXES: dict[str, ReasoningSyntax] = {
    s.name: s
    for s in (
        # Qwen3, DeepSeek R1/V3.1+, GLM-4.5+, SmolLM3, MiniMax
        ReasoningSyntax("think", "<think>", "</think>"),
        ReasoningSyntax("seed", "<seed:think>", "</seed:think>"),  # ByteDance Seed-OSS
        ReasoningSyntax("mistral", "[THINK]", "[/THINK]"),  # Magistral
        ReasoningSyntax("kimi", "◁think▷", "◁/think▷"),  # Kimi K1.5/VL thinking
    )
}

# How far after `add_generation_prompt` the generation header is looked for (template source chars).
_GENERATION_PROMPT_WINDOW = 400


def detect_reasoning(chat_template: str | None) -> ReasoningSyntax | None:
    """The reasoning markup a template uses, or None for models that do not reason in-band."""
    template = chat_template or ""
    for syntax in SYNTAXES.values():
        if syntax.close in template:
            return ReasoningSyntax(syntax.name, syntax.open, syntax.close, _opens_in_prompt(template, syntax))
    return None


def _opens_in_prompt(template: str, syntax: ReasoningSyntax) -> bool:
    """Whether the generation prompt ends with an open tag that is not closed right away.

    Qwen3's hybrid template writes `<think>\\n\\n</think>` there only to switch thinking off, which is
    not an open block; DeepSeek's writes a bare `<think>` (or `</think>` when thinking is off).
    NOTE: a heuristic over template source; `prompt_opens_reasoning` on the rendered prompt is exact.
    """
    at = template.rfind("add_generation_prompt")
    if at < 0:
        return False
    window = template[at : at + _GENERATION_PROMPT_WINDOW]
    bare_open = re.compile(re.escape(syntax.open) + r"(?!(?:\\n|\s)*" + re.escape(syntax.close) + ")")
    return bare_open.search(window) is not None


def prompt_opens_reasoning(prompt: str, syntax: ReasoningSyntax) -> bool:
    """Exact answer from the rendered prompt: it ends inside an open reasoning block."""
    return prompt.rstrip().endswith(syntax.open)
