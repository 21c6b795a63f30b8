"""Per-batch attention metadata, set by the runner and read by attention layers.

The runner builds one flat batch per step: sequences are ordered decodes first
(one query token each), then prefills (one chunk each). Every tensor lives on the
model's device; the `*_cpu` lists are host copies so backends never sync to read
shapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    block_size: int
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset for each new token
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int64, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int64: KV length after this step (context + new)
    query_start_loc_cpu: list[int]  # [num_seqs + 1] offsets of each sequence's queries in the flat batch
    seq_lens_cpu: list[int]  # [num_seqs]
    context_lens_cpu: list[int]  # [num_seqs] tokens already in the cache before this step
    # [num_seqs] the engine's request ids; with them a CPU backend may keep per-sequence state
    # across steps (the torch backend's decode workspace). None: every step stands alone.
    seq_ids: list[str] | None = None
    # The step computes prompt tokens (a prefill chunk, even of one token, or a recompute). The CPU's
    # low-bit kernels round activations to int8 and serve decode-only steps: a prompt's KV and first
    # token are then the same whether it was prefilled whole or its tail after a prefix-cache hit.
    computes_prompt: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


_current: AttentionMetadata | None = None


@contextlib.contextmanager
def forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    """Scope `metadata` to one model forward (attention layers read it with `get_attention_metadata`)."""
    global _current
    previous, _current = _current, metadata
    try:
        yield
    finally:
        _current = previous


def step_computes_prompt() -> bool:
    """Inside a forward whose step computes prompt tokens (AttentionMetadata.computes_prompt); False
    outside any forward_context (the LM head, called after it on one row per sampling sequence)."""
    return _current is not None and _current.computes_prompt


def get_attention_metadata() -> AttentionMetadata:
    assert _current is not None, "attention called outside forward_context()"
    return _current
