"""SamplingParams: how one request picks its next tokens (frozen, validated once)."""

from __future__ import annotations

import math
from dataclasses import dataclass


class SamplingParamsError(ValueError):
    """A sampling field is out of range; the API layer turns it into a 400."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    frequency_penalty: float = 0.0  # OpenAI semantics, over generated tokens
    repetition_penalty: float = 1.0  # HF/CTRL semantics, over prompt + generated tokens
    repetition_last_n: int = 0  # the penalty's window: the sequence's last N tokens (llama.cpp); 0: all
    # DRY (engine/dry.py): a token that would extend a verbatim repeat within the answer of n >=
    # dry_allowed_length tokens loses dry_multiplier * dry_base ** (n - dry_allowed_length). 0: off.
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    # HF's exponential_decay_length_penalty: past `length_decay_start` generated tokens, each step
    # raises the end-of-sequence logit s by |s| * (factor ** (tokens past the start) - 1). 1.0: off.
    length_decay_start: int = 0
    length_decay_factor: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # None: off; 0: sampled token only; k: plus the top k
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        checks = [
            (math.isfinite(self.temperature) and self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= -1, "top_k must be -1, 0 or positive"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (0 < self.repetition_penalty <= 10, "repetition_penalty must be in (0, 10]"),
            (self.repetition_last_n >= 0, "repetition_last_n must be >= 0"),
            (0 <= self.dry_multiplier <= 10, "dry_multiplier must be in [0, 10]"),
            (1 <= self.dry_base <= 10, "dry_base must be in [1, 10]"),
            (self.dry_allowed_length >= 1, "dry_allowed_length must be >= 1"),
            (self.length_decay_start >= 0, "length_decay_start must be >= 0"),
            (1 <= self.length_decay_factor <= 10, "length_decay_factor must be in [1, 10]"),
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]"),
            (all(math.isfinite(b) for _, b in self.logit_bias), "logit_bias values must be finite"),
            (all(t >= 0 for t, _ in self.logit_bias), "logit_bias token ids must be >= 0"),
            (self.seed is None or -(2**63) <= self.seed < 2**64, "seed must fit in 64 bits"),
        ]
        for ok, message in checks:
            if not ok:
                raise SamplingParamsError(message)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or self.dry_multiplier > 0
            or (self.length_decay_factor > 1 and not self.ignore_eos)
        )
