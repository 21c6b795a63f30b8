"""Activations by HF name, and the gated form over a fused `[gate | up]` projection output."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise activation an HF `hidden_act` names."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {name!r} (known: {sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def get_gated_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """`[..., 2 * d]` (gate then up) -> `[..., d]`: act(gate) * up."""
    act = get_activation(name)

    def gated(x: torch.Tensor) -> torch.Tensor:
        if act is F.silu and x.is_cuda and x.dim() == 2:
            from kvserve.models.layers import fused_ops

            if fused_ops.ENABLED:
                return fused_ops.silu_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return act(gate) * up

    return gated
