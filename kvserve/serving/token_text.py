"""Token id -> its text and exact UTF-8 bytes, for logprobs.

Decoding one token alone loses bytes when the token holds part of a character (U+FFFD), so
the bytes come from the vocabulary piece where the tokenizer's scheme is known: byte-level
BPE (GPT-2, Llama 3, Qwen, SmolLM2) maps each byte to one printable character; SentencePiece
with byte fallback writes raw bytes as `<0xNN>` and spaces as `▁`. Otherwise we decode.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from kvserve.serving.engine_protocol import Logprob
from kvserve.serving.events import TokenLogprob

# vLLM's floor: -inf (a banned token) is not valid JSON.
MIN_LOGPROB = -9999.0
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SENTENCEPIECE_SPACE = "\u2581"


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_DECODER = _gpt2_byte_decoder()


class TokenTexts:
    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._piece_bytes = _piece_decoder(tokenizer)
        self._cache: dict[int, tuple[str, tuple[int, ...]]] = {}

    def text_and_bytes(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        cached = self._cache.get(token_id)
        if cached is None:
            raw = self._bytes(token_id)
            cached = (raw.decode("utf-8", errors="replace"), tuple(raw))
            self._cache[token_id] = cached
        return cached

    def logprobs(self, logprobs: Iterable[Logprob]) -> tuple[TokenLogprob, ...]:
        return tuple(
            TokenLogprob(
                *self.text_and_bytes(lp.token_id),
                _finite(lp.logprob),
                tuple(TokenLogprob(*self.text_and_bytes(t), _finite(v)) for t, v in lp.top),
            )
            for lp in logprobs
        )

    def _bytes(self, token_id: int) -> bytes:
        piece = self._piece_bytes(token_id) if self._piece_bytes is not None else None
        if piece is not None:
            return piece
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8", "surrogatepass")


def _finite(value: float) -> float:
    return max(value, MIN_LOGPROB) if math.isfinite(value) else MIN_LOGPROB


def _piece_decoder(tokenizer: Any) -> Callable[[int], bytes | None] | None:
    """The bytes of a vocabulary piece, for the two schemes we can read; None if neither."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if convert is None or backend is None:
        return None
    kind = type(backend.decoder).__name__ if backend.decoder is not None else ""

    def piece(token_id: int) -> str | None:
        value = convert(token_id)
        return value if isinstance(value, str) else None

    if kind == "ByteLevel":

        def byte_level(token_id: int) -> bytes | None:
            text = piece(token_id)
            if text is None or any(c not in _BYTE_DECODER for c in text):
                return None  # an added token stored as plain text: decode it instead
            return bytes(_BYTE_DECODER[c] for c in text)

        return byte_level

    def sentencepiece(token_id: int) -> bytes | None:
        text = piece(token_id)
        if text is None:
            return None
        match = _BYTE_PIECE.fullmatch(text)
        if match is not None:
            return bytes([int(match.group(1), 16)])
        if _SENTENCEPIECE_SPACE not in text:
            return None  # plain text: decoding it is exact
        return text.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")

    return sentencepiece
