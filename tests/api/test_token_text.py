"""TokenTexts: a token's text and exact bytes, for both vocabulary schemes and the decode fallback."""

from __future__ import annotations

import math

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from kvserve.serving.engine_protocol import Logprob
from kvserve.serving.token_text import MIN_LOGPROB, TokenTexts
from tests.api.fake_engine import ByteTokenizer


def _hf(vocab: dict[str, int], decoder: decoders.Decoder, byte_fallback: bool = False) -> object:
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=byte_fallback)
    tokenizer = Tokenizer(model)
    tokenizer.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_byte_level_pieces_give_exact_bytes() -> None:
    # GPT-2's byte alphabet: "Ġ" is the space, "Ã" and "©" are the two bytes of "é" (C3 A9).
    hf = _hf({"<unk>": 0, "Ġh": 1, "Ã": 2, "©": 3, "<|end|>": 4}, decoders.ByteLevel())
    texts = TokenTexts(hf)
    assert texts.text_and_bytes(1) == (" h", (0x20, 0x68))
    assert texts.text_and_bytes(2) == ("\ufffd", (0xC3,))
    assert texts.text_and_bytes(3) == ("\ufffd", (0xA9,))
    assert bytes(texts.text_and_bytes(2)[1] + texts.text_and_bytes(3)[1]).decode() == "é"
    assert texts.text_and_bytes(4) == ("<|end|>", tuple(b"<|end|>"))


def test_sentencepiece_pieces_give_exact_bytes() -> None:
    decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    vocab = {"<unk>": 0, "\u2581hello": 1, "<0xC3>": 2, "<0xA9>": 3, "world": 4}
    hf = _hf(vocab, decoder, byte_fallback=True)
    texts = TokenTexts(hf)
    assert texts.text_and_bytes(1) == (" hello", tuple(b" hello"))
    assert texts.text_and_bytes(2) == ("\ufffd", (0xC3,))
    assert texts.text_and_bytes(4) == ("world", tuple(b"world"))


def test_other_tokenizers_are_decoded_and_logprobs_stay_finite() -> None:
    texts = TokenTexts(ByteTokenizer())
    assert texts.text_and_bytes(ord("a")) == ("a", (ord("a"),))
    (entry,) = texts.logprobs([Logprob(ord("a"), -math.inf, ((ord("a"), -0.5), (ord("b"), math.nan)))])
    assert entry.logprob == MIN_LOGPROB and [t.logprob for t in entry.top] == [-0.5, MIN_LOGPROB]
    assert [t.token for t in entry.top] == ["a", "b"] and entry.top[0].top == ()
