"""Which RoPE a request runs with when the context plan scales RoPE on demand (models/rope_scaling.py).

Static YaRN costs every prompt, however short (SmolLM2 at x2: +1.2% perplexity, KL 0.023 on 512-token
chunks, docs/numerics.md). So under an automatic `--ctx` past the trained context the engine keeps
two regimes: a request runs with the model's trained RoPE when its prompt plus a reserve for its
answer fits the trained context, else scaled. The reserve is min(max_tokens, trained / 2): a prompt
under half the trained context runs as trained whatever max_tokens it asks (agents ask 32K), and an
answer that still outgrows the trained context is switched to the scaled regime by recomputing its
KV (Scheduler), which can only happen after at least trained / 2 decode steps, so the re-prefill of
at most the trained context costs a fraction of the decoding that led to it.

The regime is part of what a block's KV means: a trained-regime request hashes its blocks under the
engine's cache key plus TRAINED_ROPE_KEY, so neither the RAM prefix cache nor the disk tier ever hands
one regime's KV to the other. A scaled request hashes exactly as a static-YaRN engine's would. In the
runner a trained token's rotary positions carry models/rope_scaling.py's TRAINED_ROPE_OFFSET.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvserve.models.rope_scaling import trained_context

if TYPE_CHECKING:
    from kvserve.engine.request import Request
    from kvserve.models.config import ModelArchConfig

# Appended to the engine's cache key in the chain hashes of trained-regime blocks.
TRAINED_ROPE_KEY = ":rope-trained"


def trained_key(extra_key: bytes | str) -> bytes | str:
    """The chain hashes' extra key of a trained-regime request of an engine whose key is `extra_key`."""
    if isinstance(extra_key, str):
        return extra_key + TRAINED_ROPE_KEY
    return extra_key + TRAINED_ROPE_KEY.encode()


@dataclass(frozen=True)
class OnDemandRope:
    """The rule of an engine that scales RoPE on demand; None stands for a one-regime engine."""

    trained_context: int  # positions [0, trained_context) run as trained

    @staticmethod
    def of(arch: ModelArchConfig) -> OnDemandRope | None:
        return OnDemandRope(trained_context(arch)) if arch.rope_scaling_on_demand else None

    def fits(self, num_prompt_tokens: int, max_tokens: int) -> bool:
        """A request of this prompt and output limit runs as trained."""
        reserve = min(max_tokens, self.trained_context // 2)
        return num_prompt_tokens + reserve <= self.trained_context

    def outgrown(self, request: Request) -> bool:
        """A trained-regime request whose next token to compute lies past the trained context: it
        must move to the scaled regime before its next step (its last token is at num_tokens - 1)."""
        return request.uses_trained_rope and request.num_tokens > self.trained_context

    def token_limit(self, request: Request) -> int:
        """Most tokens the request may reach in its regime without a switch (engine/overlap.py's
        bound for steps it launches ahead)."""
        return self.trained_context if request.uses_trained_rope else 1 << 62
