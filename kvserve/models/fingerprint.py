"""A stable identity for loaded weights, mixed into KV block hashes.

Two runs share cached KV only if the fingerprint matches, so it covers everything that
changes the K/V values: architecture fields, the compute dtype, every tensor's name,
shape and dtype, and a digest of its data.

Data digest choice: hashing every byte of a multi-GB checkpoint would add seconds to
minutes to startup, so each tensor contributes its byte size plus up to 64 KiB sampled
at 16 evenly spaced 4 KiB windows across its bytes (all of it when smaller). Different
checkpoints, quantizations or fine-tunes differ in sampled bytes with overwhelming
probability; an edit confined to unsampled bytes would go unnoticed, an accepted risk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
import xxhash

from kvserve.models.config import ModelArchConfig

_NUM_WINDOWS = 16
_WINDOW_BYTES = 4096  # 16 x 4 KiB = 64 KiB sampled per tensor


def model_fingerprint(
    arch: ModelArchConfig, dtype: torch.dtype, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> str:
    """Hex xxh3-128 digest; `named_tensors` in a deterministic order (e.g. `state_dict().items()`)."""
    h = xxhash.xxh3_128()
    # NOTE: rope_scaling_on_demand is left out: the scaled regime's KV is a static-YaRN engine's, and
    # the unscaled regime's blocks carry their own key (engine/rope_regime.py).
    fields = {k: v for k, v in dataclasses.asdict(arch).items() if k != "rope_scaling_on_demand"}
    h.update(repr(sorted(fields.items())).encode())
    h.update(str(dtype).encode())
    for name, tensor in named_tensors:
        num_bytes = tensor.numel() * tensor.element_size()
        h.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{num_bytes}".encode())
        h.update(_sample_bytes(tensor))
    return h.hexdigest()


def _sample_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)  # [num_bytes]
    num_bytes = flat.numel()
    if num_bytes <= _NUM_WINDOWS * _WINDOW_BYTES:
        return flat.cpu().numpy().tobytes()
    stride = (num_bytes - _WINDOW_BYTES) // (_NUM_WINDOWS - 1)
    starts = torch.arange(_NUM_WINDOWS, device=flat.device) * stride  # [num_windows]
    index = (starts[:, None] + torch.arange(_WINDOW_BYTES, device=flat.device)).reshape(-1)
    return flat[index].cpu().numpy().tobytes()
