"""The incremental detokenizer never emits a partial UTF-8 character and loses no text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvserve.chat.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Each token id is one byte; decoding replaces incomplete sequences, like byte-level BPE."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def _stream(text: str, chunk_sizes: list[int]) -> list[str]:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, prompt_token_ids=tok.encode("prompt "))
    pieces, i, k = [], 0, 0
    while i < len(ids):
        size = chunk_sizes[k % len(chunk_sizes)]
        pieces.append(detok.push(ids[i : i + size]))
        i, k = i + size, k + 1
    pieces.append(detok.flush())
    return pieces


def test_multibyte_characters_are_held_back_until_complete() -> None:
    pieces = _stream("héllo 世界 🎉!", [1])
    assert "".join(pieces) == "héllo 世界 🎉!"
    assert all("\ufffd" not in p for p in pieces)
    assert "🎉" in pieces  # the 4-byte emoji arrives whole, on its last byte


@given(st.text(min_size=1, max_size=40), st.lists(st.integers(1, 5), min_size=1, max_size=5))
def test_any_chunking_reassembles_the_text(text: str, chunk_sizes: list[int]) -> None:
    pieces = _stream(text, chunk_sizes)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in text


def test_truncated_character_is_flushed_as_replacement() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.encode("ok ")) == "ok "
    assert detok.push(list("é".encode())[:1]) == ""
    assert detok.flush() == "\ufffd"
