"""Low-bit weight-only linears for fp32 decode on AVX2 CPUs: the packing, a torch reference of
the kernel's math, and the calls into the C++ kernels (csrc/lowbit_linear.cpp for decode,
csrc/lowbit_gemm.cpp for the opt-in int8 prefill; built by cpu_ext).

Why its own format: torch's int4/int8 weight-only CPU ops are fast only with AVX512 (on AVX2
they lose to the dense fp32 GEMV), so CPUs without it had no low-bit decode. This is ggml's
scheme (Q4_1 / Q8_0 weights, the activation row quantized to int8 per group of 32), the one
llama.cpp decodes with; the kernel fuses a decoder layer's RMSNorm, residual adds and SiLU-mul.

Without a compiler or AVX2/FMA/F16C, `lowbit_linear` runs the torch reference (same math,
slow): a correct fallback (`cpu_ext.load()` is None then, and says why in the log).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from kvserve.models.layers import cpu_ext

GROUP_SIZE = 32
Bits = Literal[4, 8]
# The kernel's gated activations (act(gate) * up), by the hidden_act names that mean them.
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1}


def quantize(weight: torch.Tensor, bits: Bits) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (qweight, fp16 scales) in the kernel's format (see lowbit_cpu.cpp)."""
    out_features, in_features = weight.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"low-bit weights need the input dim divisible by {GROUP_SIZE}, got {in_features}")
    w = weight.float().view(out_features, -1, GROUP_SIZE)  # [N, G, 32]
    if bits == 8:
        d = (w.abs().amax(dim=-1) / 127).half()  # [N, G]
        inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
        q = torch.round(w * inv[..., None]).clamp(-127, 127).to(torch.int8)
        return q.view(out_features, in_features).contiguous(), d.contiguous()
    w_min, w_max = w.amin(dim=-1), w.amax(dim=-1)
    d, m = ((w_max - w_min) / 15).half(), w_min.half()  # quantize against the stored fp16 values
    inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round((w - m.float()[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # [N, G, 16]: ggml's nibble order
    return packed.view(out_features, in_features // 2).contiguous(), torch.stack(
        [d, m], dim=1
    ).contiguous()  # [N, 2, G]


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, bits: Bits) -> torch.Tensor:
    """The fp32 [N, K] weight the packed form stands for."""
    if bits == 8:
        n, k = qweight.shape
        return (qweight.float().view(n, -1, GROUP_SIZE) * scales.float()[..., None]).view(n, k)
    n, half_k = qweight.shape
    packed = qweight.view(n, -1, GROUP_SIZE // 2)
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).float()  # [N, G, 32]
    d, m = scales.float().unbind(1)  # [N, G] each
    return (q * d[..., None] + m[..., None]).view(n, 2 * half_k)


def reference_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bits: Bits,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    quantize_x: bool = True,
    act: str = "silu",
    post_norm: torch.Tensor | None = None,
    post_eps: float = 1e-6,
) -> torch.Tensor:
    """The kernel's math in torch (activations rounded to int8 per group like the kernel)."""
    if norm_weight is not None:
        x = F.rms_norm(x, (x.shape[-1],), norm_weight, eps)
    if quantize_x:
        groups = x.view(x.shape[0], -1, GROUP_SIZE)  # [M, G, 32]
        dx = groups.abs().amax(dim=-1, keepdim=True) / 127
        qx = torch.round(groups * torch.where(dx > 0, 1 / dx, torch.zeros_like(dx)))
        x = (qx * dx).view_as(x)
    out = F.linear(x, dequantize(qweight, scales, bits), bias)
    if gated:
        gate, up = out.chunk(2, dim=-1)
        out = (F.silu(gate) if ACTIVATIONS[act] == 0 else F.gelu(gate, approximate="tanh")) * up
    if post_norm is not None:
        out = F.rms_norm(out, (out.shape[-1],), post_norm, post_eps)
    return out if residual is None else out + residual


def lowbit_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bits: Bits,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    quantize_x: bool = True,
    packed: torch.Tensor | None = None,
    act: str = "silu",
    post_norm: torch.Tensor | None = None,
    post_eps: float = 1e-6,
) -> torch.Tensor:
    """act(rms_norm?(x) @ W^T + bias) + residual for fp32 x [M, K] (the kernel, else the reference).
    quantize_x=False keeps x in fp32 (int8 weights only, no norm): for the LM head. `packed`
    (pack_for_decode of the same weights) is what the kernel reads where it can. `act`: the gated
    activation (ACTIVATIONS); post_norm: RMSNorm scale applied to the output before the residual add
    (Gemma's post-attention and post-feedforward norms)."""
    args = (bias, residual, norm_weight, eps, gated, quantize_x)
    ext = cpu_ext.load()
    if ext is None:
        return reference_linear(x, qweight, scales, bits, *args, act, post_norm, post_eps)
    return ext.lowbit_linear(
        x.contiguous(), qweight, scales, bits, *args, packed, ACTIVATIONS[act], post_norm, post_eps
    )


def pack_for_decode(qweight: torch.Tensor, scales: torch.Tensor, bits: Bits) -> torch.Tensor:
    """The decode GEMV's "x4" layout (csrc/lowbit_x4.h): blocks of 4 output rows, each one run of
    bytes with every group's fp16 scales beside its quants; N is padded to a multiple of 4 with zeros.
    int4: uint8 [N/4, 80 G] = per group d[4] and 4 x 16 nibble bytes (72 G), then the mins [4, G];
    int8: uint8 [N/4, 136 G] = per group d[4] and 4 x 32 int8."""
    n = qweight.shape[0]
    num_groups, pad = scales.shape[-1], -n % 4
    quants = qweight.view(torch.uint8).view(n, num_groups, -1)  # [N, G, 16 or 32] bytes
    fp16 = scales.view(n, -1, num_groups)  # [N, 1 (d) or 2 (d, m), G]
    if pad:
        quants, fp16 = F.pad(quants, (0, 0, 0, 0, 0, pad)), F.pad(fp16, (0, 0, 0, 0, 0, pad))
    blocks = (n + pad) // 4
    fp16 = fp16.view(blocks, 4, -1, num_groups)  # [b, row, d|m, g]
    d = fp16[:, :, 0].transpose(1, 2).contiguous().view(torch.uint8)  # [b, g, 4 rows * 2 bytes]
    quant_bytes = quants.view(blocks, 4, num_groups, -1).transpose(1, 2).reshape(blocks, num_groups, -1)
    parts = [torch.cat([d, quant_bytes], dim=-1).view(blocks, -1)]  # [b, G * (8 + 4 * 16|32)]
    if bits == 4:
        parts.append(
            fp16[:, :, 1].contiguous().view(torch.uint8).view(blocks, -1)
        )  # mins [b, 4 rows * G * 2]
    return torch.cat(parts, dim=-1).contiguous()


def pack_for_gemm(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 weights in the prefill GEMM's layout (csrc/lowbit_gemm.h): blocks of 8 output rows,
    uint8 [N/8, G, 4, 32] and fp32 (scale, min) [N/8, G, 2, 8]; N is padded to a multiple of 8."""
    n, half_k = qweight.shape
    num_groups, pad = half_k * 2 // GROUP_SIZE, -n % 8
    packed = qweight.view(n, num_groups, GROUP_SIZE // 2)
    d, m = scales.float().unbind(1)  # [N, G] each
    if pad:  # zero weights (q = 0, scale and min 0) for the padding rows
        packed = F.pad(packed, (0, 0, 0, 0, 0, pad))
        d, m = F.pad(d, (0, 0, 0, pad)), F.pad(m, (0, 0, 0, pad))
    blocks = (n + pad) // 8
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # [N, G, 32]: k = 16 half + 4j + t
    q = q.view(blocks, 8, num_groups, 2, 4, 4)  # [b, i, g, half, j, t]
    gemm_q = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # k = 4j + t low, 16 + 4j + t high: [b, i, g, j, t]
    gemm_q = gemm_q.permute(0, 2, 3, 1, 4).reshape(blocks, num_groups, 4, 32).contiguous()
    gemm_scales = torch.stack([d, m], dim=1).view(blocks, 8, 2, num_groups).permute(0, 3, 2, 1).contiguous()
    return gemm_q, gemm_scales  # [b, g, 4, 32], [b, g, 2, 8]


def lowbit_gemm(
    x: torch.Tensor,
    gemm_qweight: torch.Tensor,
    gemm_scales: torch.Tensor,
    out_features: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """x [M, K] @ W^T (+ bias) on the int4 prefill GEMM: the decode kernel's math (activations rounded
    to int8 per group of 32) for many rows; None without the kernel (the caller keeps its dense GEMM)."""
    ext = cpu_ext.load()
    if ext is None:
        return None
    return ext.lowbit_gemm(x.contiguous(), gemm_qweight, gemm_scales, out_features, bias)
