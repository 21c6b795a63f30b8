"""TokenConstraint: a per-request restriction on the next token (constrained decoding).

The engine knows nothing of what a constraint encodes (a JSON schema, a tool-call syntax): it asks
each constrained row for an allowed-token bitmask before sampling, may be told to sample that step
greedily, and feeds every sampled token back. `kvserve/grammar/` implements it over llguidance.
Plain Python (no torch), so the layers above can build constraints without importing the runner.
"""

from __future__ import annotations

from typing import Protocol


class TokenConstraint(Protocol):
    """Mutable per-request state, touched by the engine thread only once the request is queued."""

    @property
    def is_masking(self) -> bool:
        """Whether `fill_bitmask` restricts the next token (False: every token is allowed)."""
        ...

    @property
    def is_greedy(self) -> bool:
        """Whether the next token must be taken greedily, whatever the request's temperature."""
        ...

    @property
    def is_finished(self) -> bool:
        """Nothing but end-of-sequence can follow: the request ends here."""
        ...

    @property
    def error(self) -> str | None:
        """Why the constraint failed (a rejected token, a grammar too complex); None while healthy."""
        ...

    @property
    def num_accepted_tokens(self) -> int: ...

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        """Write the allowed tokens of the next step as little-endian int32 words (bit i of word w
        allows token 32 * w + i) into `num_bytes` of host memory at `address`."""
        ...

    def accept_token(self, token_id: int) -> bool:
        """Advance past a sampled token; False (and `error` set) when the constraint rejects it."""
        ...

    def reset(self) -> None:
        """Back to the state before the first accepted token."""
        ...


def catch_up(constraint: TokenConstraint, output_token_ids: list[int]) -> None:
    """Rebuild the constraint's state from the request's output when the two disagree (a request
    rebuilt from its tokens after preemption or a restart): replay every token from the start."""
    if constraint.num_accepted_tokens == len(output_token_ids):
        return
    constraint.reset()
    for token_id in output_token_ids:
        if not constraint.accept_token(token_id):
            return
