"""Per-step token masks of the constrained rows of a batch (grammar-constrained decoding).

Computed on the host by each row's TokenConstraint (llguidance fills the words in place), while the
device runs the forward; the sampler applies them on the device. A batch without constrained rows
builds nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.engine.constraint import TokenConstraint, catch_up
from kvserve.engine.request import Request


class TokenMasks(NamedTuple):
    bitmask: torch.Tensor | None  # [B, ceil(V / 32)] int32 on the host, -1 (all allowed) on free rows
    force_greedy: list[bool] | None  # per row; None when no row is constrained


NO_MASKS = TokenMasks(None, None)


def build_token_masks(requests: list[Request], vocab_size: int, pin_memory: bool) -> TokenMasks:
    constraints = [r.constraint for r in requests]
    if all(c is None for c in constraints):
        return NO_MASKS
    masking: list[tuple[int, TokenConstraint]] = []
    for row, (request, constraint) in enumerate(zip(requests, constraints)):
        if constraint is not None:
            catch_up(constraint, request.output_token_ids)
            if constraint.is_masking:
                masking.append((row, constraint))
    bitmask = None
    if masking:
        num_words = (vocab_size + 31) // 32
        bitmask = torch.full((len(requests), num_words), -1, dtype=torch.int32, pin_memory=pin_memory)
        for row, constraint in masking:
            bitmask[row].zero_()  # words past the constraint's vocabulary stay "not allowed"
            constraint.fill_bitmask(bitmask[row].data_ptr(), num_words * 4)
    return TokenMasks(bitmask, [c is not None and c.is_greedy for c in constraints])
