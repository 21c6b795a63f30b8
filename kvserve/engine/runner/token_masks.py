"""Per-step token masks of the constrained rows of a batch (grammar-constrained decoding).

Computed on the host by each row's TokenConstraint (llguidance fills the words in place), while the
device runs the forward; the sampler applies them on the device. A batch without constrained rows
builds nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.engine.constraint import catch_up
from kvserve.engine.request import Request


class TokenMasks(NamedTuple):
    bitmask: torch.Tensor | None  # [B, ceil(V / 32)] int32 on the host, -1 (all allowed) on free rows
    force_greedy: list[bool] | None  # per row; None when no row is constrained


NO_MASKS = TokenMasks(None, None)


def build_token_masks(requests: list[Request], vocab_size: int, pin_memory: bool) -> TokenMasks:
    constrained = [(row, r) for row, r in enumerate(requests) if r.constraint is not None]
    if not constrained:
        return NO_MASKS
    for _, request in constrained:
        assert request.constraint is not None
        catch_up(request.constraint, request.output_token_ids)
    masking = [(row, r.constraint) for row, r in constrained if r.constraint.is_masking]  # type: ignore[union-attr]
    bitmask = None
    if masking:
        num_words = (vocab_size + 31) // 32
        bitmask = torch.full((len(requests), num_words), -1, dtype=torch.int32, pin_memory=pin_memory)
        for row, constraint in masking:
            bitmask[row].zero_()  # words past the constraint's vocabulary stay "not allowed"
            constraint.fill_bitmask(bitmask[row].data_ptr(), num_words * 4)
    return TokenMasks(bitmask, [r.constraint is not None and r.constraint.is_greedy for r in requests])
