"""A one-character-per-token tokenizer: exact encode/decode round trips, so lengths are checkable."""

from __future__ import annotations


class CharTokenizer:
    all_special_ids = [0, 1]  # noqa: RUF012 (mirrors the HF attribute)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def __len__(self) -> int:
        return 128  # ASCII
