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


def _byte_level_fast_tokenizer():  # type: ignore[no-untyped-def]
    """A real HF fast tokenizer (byte-level BPE, one token per byte, no merges): the Rust path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


class _PythonOnly:
    """Hides the Rust backend, so the detokenizer takes its Python path over the same tokenizer."""

    def __init__(self, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self._tokenizer = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


_FAST = _byte_level_fast_tokenizer()


@given(st.text(min_size=1, max_size=30), st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_rust_stream_matches_the_python_window(text: str, chunk_sizes: list[int]) -> None:
    ids = _FAST.encode(text, add_special_tokens=False)
    prompt = _FAST.encode("a prompt ", add_special_tokens=False)
    fast, slow = IncrementalDetokenizer(_FAST, prompt), IncrementalDetokenizer(_PythonOnly(_FAST), prompt)
    assert fast._stream is not None and slow._stream is None
    fast_pieces, slow_text, i, k = [], "", 0, 0
    while i < len(ids):
        chunk = ids[i : i + chunk_sizes[k % len(chunk_sizes)]]
        fast_pieces.append(fast.push(chunk))
        slow_text += slow.push(chunk)
        i, k = i + len(chunk), k + 1
    # Same text; the Rust path may emit a finished character sooner (the Python one holds a chunk
    # back whole while it ends mid-character), never a partial one.
    assert "".join(fast_pieces) + fast.flush() == slow_text + slow.flush() == text
    assert all("\ufffd" not in piece for piece in fast_pieces) or "\ufffd" in text


def test_rust_stream_flushes_a_truncated_character() -> None:
    detok = IncrementalDetokenizer(_FAST)
    assert detok.push(_FAST.encode("ok ", add_special_tokens=False)) == "ok "
    assert detok.push(_FAST.encode("é", add_special_tokens=False)[:1]) == ""
    assert detok.flush() == "\ufffd"
