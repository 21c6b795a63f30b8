"""RMSNorm, with Gemma's `(1 + w)` weight convention as an option."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """`x / rms(x) * w` over the last dim; the statistics are taken in fp32 as HF does.

    `offset=1.0` gives Gemma's variant: the checkpoint stores `w - 1` (zeros-initialized),
    so the scale is `1 + w`, applied in fp32 before casting back (HF Gemma3RMSNorm order).
    """

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0.0 else torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.offset == 0.0 and x.dim() == 2:
            from kvserve.models.layers import fused_ops

            if fused_ops.ENABLED:
                return fused_ops.rms_norm(x, self.weight, self.eps)[0]
        if self.offset != 0.0:
            scale = self.weight.float() + self.offset
            return F.rms_norm(x.float(), (x.shape[-1],), scale, self.eps).type_as(x)
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # HF (Llama/Qwen): normalize in fp32, cast to the input dtype, then scale in that dtype.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)

    def scale(self) -> torch.Tensor:
        """The fp32 scale the normalized x is multiplied by (`1 + w` for Gemma), for the CPU kernels;
        the weight itself where there is no offset (no copy)."""
        if self.offset == 0.0:
            return self.weight
        return self.weight.float() + self.offset

    def forward_with_residual(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), one kernel on CUDA."""
        if x.is_cuda and self.offset == 0.0 and x.dim() == 2:
            from kvserve.models.layers import fused_ops

            if fused_ops.ENABLED:
                normed, total = fused_ops.rms_norm(x, self.weight, self.eps, residual)
                assert total is not None
                return normed, total
        total = x + residual
        return self.forward(total), total

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.offset}"
