"""Small helpers the XML-ish syntaxes (qwen3_coder, glm, deepseek_dsml) share."""

from __future__ import annotations


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def strip_partial(text: str, marker: str) -> str:
    """`text` without a tail that is a proper prefix of `marker` (a closing tag cut by max_tokens)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


def is_partial(rest: str, *markers: str) -> bool:
    """Whether `rest` (the cut tail of a block) is only the start of one of `markers`."""
    rest = rest.strip()
    return not rest or any(m.startswith(rest) or (rest.startswith(m) and ">" not in rest) for m in markers)


def one_newline_trimmed(value: str) -> str:
    """Templates write `>\\nvalue\\n</`; the newline pair is framing, not payload."""
    value = value.removeprefix("\n")
    value = value.removesuffix("\n")
    return value
