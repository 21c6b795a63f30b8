"""Incremental detokenization that never emits a partial UTF-8 character.

Decoding token by token breaks multi-byte characters and BPE-merged spaces, so each
step decodes a short window (from `prefix_offset`) and emits only the new suffix once
it no longer ends in U+FFFD (an incomplete byte sequence). Same scheme as TGI/vLLM.
"""

from __future__ import annotations

from typing import Protocol

# Tokens kept before the new ones so the decoder sees word boundaries (leading-space rules).
_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Decoder, prompt_token_ids: list[int] = (), skip_special_tokens: bool = True
    ):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._token_ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)

    def push(self, token_ids: list[int] | tuple[int, ...]) -> str:
        """Add sampled tokens; return the text that is now complete (maybe empty)."""
        self._token_ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._token_ids))
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character stays U+FFFD)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._token_ids))
        self._prefix_offset = self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._token_ids[start:end], skip_special_tokens=self._skip_special)
