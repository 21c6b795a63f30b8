"""Weight-only low-bit linear layers for CPU decode.

Decode GEMVs are memory-bandwidth bound (about 12 GB/s on the 2-core machines here, so a
135M-parameter model in bf16 cannot exceed ~45 tok/s), while prefill GEMMs are compute
bound, where oneDNN's dense kernels win. So each layer keeps its dense weight for large
batches and a packed low-bit copy for batches of up to `max_quant_rows` tokens:
- bf16 models: torch's int8/int4 weight-only CPU kernels (fast with AVX512);
- fp32 models (CPUs without fast bf16): the AVX2 kernel of lowbit_cpu.py (ggml's Q4_1/Q8_0); opt-in
  (`int8_prefill`), int4 also replaces the dense GEMM of prefill with an int4 x int8 GEMM of the
  decode kernel's math.

int4: asymmetric, groups of 32 along the input dim (the Q4_0/Q4_1 grid of GGUF files, so a
Q4 checkpoint round-trips up to rounding of its scales). int8: symmetric per output row
(bf16) or per group of 32 (fp32).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.env import switches
from kvserve.models.layers import cpu_ext, lowbit_cpu
from kvserve.models.layers.attention.metadata import step_computes_prompt
from kvserve.models.layers.linear import MergedLinear

WeightQuant = Literal["none", "int8", "int4"]
INT4_GROUP_SIZE = 32
# Rows (tokens) up to which each low-bit kernel beats dense bf16 here (measured on the SmolLM2
# shapes with weights streamed from DRAM); above it the GEMM is compute bound and dense wins.
MAX_QUANT_ROWS = {"int8": 4, "int4": 16}
# The fp32 kernel (lowbit_cpu) loops over rows inside one weight read: it beats the dense fp32
# GEMM (4 bytes per weight from DRAM) up to about this many rows.
MAX_QUANT_ROWS_FP32 = 16


class WeightOnlyLinear(nn.Module):
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scheme: WeightQuant,
        max_quant_rows: int | None = None,
        quantize_input: bool = True,
        int8_prefill: bool = False,
        prompt_dense: bool = True,
        bf16_prefill: bool = False,
        keep_prefill_dtype: bool = False,
    ) -> None:
        super().__init__()
        assert weight.dtype in (torch.bfloat16, torch.float32) and weight.device.type == "cpu", "CPU only"
        assert scheme != "none"
        self.weight = weight  # [out, in] dense, for prefill-sized batches
        self.bias = bias
        self.dense_bias = bias  # the dense path's: bf16 with bf16_prefill
        self.out_dtype = weight.dtype  # of every path's output, unless keep_prefill_dtype
        # bf16_prefill: prompt batches return the dense GEMM's bf16 output as it is (the MLP's gate/up,
        # whose only readers are the gated activation and down_proj's bf16 GEMM).
        self.keep_prefill_dtype = False
        self.scheme = scheme
        # fp32 kernel only: False keeps activations in fp32 (the LM head's argmax is sensitive).
        self.quantize_input = quantize_input
        # A decoder layer's linear: steps that compute prompt tokens use the dense weights. False for
        # the LM head, which sees one row per sampling sequence, the same rows cold or cached.
        self.prompt_dense = prompt_dense
        self.gemm_qweight: torch.Tensor | None = None  # int8_prefill: lowbit_cpu.pack_for_gemm's layout
        self.gemm_scales: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None  # fp32 decode GEMV: lowbit_cpu.pack_for_decode's layout
        # fp32: lowbit_cpu's format and kernel; bf16: torch's packed int8/int4 ops.
        self.bits: lowbit_cpu.Bits | None = None
        if weight.dtype == torch.float32:
            self.bits = 8 if scheme == "int8" else 4
            self.qweight, self.scales = lowbit_cpu.quantize(weight, self.bits)
            if (self.bits == 4) == quantize_input:  # the kernel's x4 cases: int4 layers, the int8 LM head
                self.packed = lowbit_cpu.pack_for_decode(self.qweight, self.scales, self.bits)
            if self.bits == 4 and int8_prefill:  # prefill-sized batches: the int4 GEMM, not the dense one
                self.gemm_qweight, self.gemm_scales = lowbit_cpu.pack_for_gemm(self.qweight, self.scales)
        elif scheme == "int8":
            self.qweight, self.scales = quantize_int8(weight)
        else:
            self.qweight, self.scales = quantize_int4(weight)
        if max_quant_rows is None:
            max_quant_rows = default_max_quant_rows(scheme, weight.dtype)
        self.max_quant_rows = max_quant_rows
        if bf16_prefill and weight.dtype == torch.float32 and self.gemm_qweight is None:
            # fp32 engine on a CPU with fast bf16 (AVX512-BF16/AMX): the dense weights, which only
            # prompt-sized batches use, in bf16 for oneDNN's bf16 GEMM (~1.7x fp32's) at half the
            # RAM; decode keeps the low-bit kernels above, which beat torch's bf16 ones ~2x.
            self.weight = weight.to(torch.bfloat16)
            self.dense_bias = None if bias is None else bias.to(torch.bfloat16)
            self.keep_prefill_dtype = keep_prefill_dtype
        self.dense_packed = pack_dense_weight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A step that computes prompt tokens runs on the dense weights (or --int8-prefill's GEMM) at
        # any size, so a prompt's KV does not depend on how much of it the prefix cache held.
        if x.shape[0] > self.max_quant_rows or (self.prompt_dense and step_computes_prompt()):
            if self.gemm_qweight is not None and self.gemm_scales is not None:
                out = lowbit_cpu.lowbit_gemm(
                    x, self.gemm_qweight, self.gemm_scales, self.weight.shape[0], self.bias
                )
                if out is not None:
                    return out
            out_dtype = self.weight.dtype if self.keep_prefill_dtype else self.out_dtype
            return _dense_rows(x, self.weight, self.dense_bias, out_dtype, self.dense_packed)
        if self.bits is not None:
            return lowbit_cpu.lowbit_linear(
                x, self.qweight, self.scales, self.bits, self.bias,
                quantize_x=self.quantize_input, packed=self.packed,
            )  # fmt: skip
        if self.scheme == "int8":
            out = torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.qweight, INT4_GROUP_SIZE, self.scales)
        return out if self.bias is None else out + self.bias

    def lowbit(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        norm_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
        gated: bool = False,
        act: str = "silu",
        post_norm: torch.Tensor | None = None,
        post_eps: float = 1e-6,
    ) -> torch.Tensor:
        """fp32 only: the low-bit kernel with a decoder layer's neighbours fused (lowbit_cpu)."""
        assert self.bits is not None
        return lowbit_cpu.lowbit_linear(
            x, self.qweight, self.scales, self.bits, self.bias, residual, norm_weight, eps, gated,
            packed=self.packed, act=act, post_norm=post_norm, post_eps=post_eps,
        )  # fmt: skip

    def extra_repr(self) -> str:
        out_features, in_features = self.weight.shape
        return f"{in_features} -> {out_features}, {self.scheme}, dense above {self.max_quant_rows} rows"


# How prompt rows reach torch's CPU GEMMs so that a row's bits depend on nothing but the row (a
# prompt's tail after a prefix-cache hit must get the KV the same tokens get inside a larger batch,
# and a request's answer must not depend on what shares its step). The kernels oneDNN and MKL pick
# depend on the row count (scripts/dense_rows_invariance.py, docs/numerics.md):
# - AVX2: fp32 rows 1-3 of a 1536 x 576 product differ from the same rows of a larger one, 16 and
#   more agree (1 and 2 threads): one call, padded with zero rows to at least MIN_GEMM_ROWS;
# - AVX-512 (a Xeon with AMX, 2 threads): bf16 rows differ from 3 rows up and fp32 rows from 57 up,
#   whatever the padding; only calls of one fixed size agree: ROW_BLOCK rows each, the last padded.
MIN_GEMM_ROWS = 16
# 128: on the AMX host, packed 128-row calls took 4.1 ms for 2,048 rows of a 1536 x 576 bf16 weight
# against 5.2 ms in 64-row calls, and 0.27 against 0.49 ms for 100 rows; 64-row calls win only at 17-64
# rows (0.17 ms), a short prompt's tail. An 8K prefill in 2,048-token steps, in-process, interleaved:
# 8.80-8.95 s against 9.23-9.24 s (1.04x; docs/numerics.md). Every fixed size gave the same bits.
ROW_BLOCK = 128


@functools.cache
def row_block() -> int:
    """This CPU's way: ROW_BLOCK-row calls (AVX-512), or 0 for one call padded to MIN_GEMM_ROWS."""
    return ROW_BLOCK if "avx512f" in cpu_ext.cpu_flags() else 0


def _dense_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    packed: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """F.linear on the dense weights, output in `out_dtype`, each row's bits independent of how many
    rows come with it (`row_block()` says how; `block` overrides it, for tests). `packed`: the weight
    in oneDNN's layout for ROW_BLOCK-row calls (`pack_dense_weight`), used with blocks."""
    block = row_block() if block is None else block
    x = x.to(weight.dtype)
    rows = x.shape[0]
    packed = packed if block == ROW_BLOCK else None  # packed for ROW_BLOCK-row calls only
    if not block or rows <= block:  # one call, padded (to the block; AVX2: to at least MIN_GEMM_ROWS)
        return _linear(_padded(x, block or MIN_GEMM_ROWS), weight, bias, packed)[:rows].to(out_dtype)
    # Each block's product goes straight into its rows of the output, cast on the way (one pass; a
    # cat of the blocks and then a cast were two over a 2,048-row step's activations); only a short
    # last block is padded.
    out = torch.empty(rows, weight.shape[0], dtype=out_dtype, device=x.device)
    for start in range(0, rows, block):
        part = x[start : start + block]
        out[start : start + len(part)].copy_(_linear(_padded(part, block), weight, bias, packed)[: len(part)])
    return out


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows appended up to `rows` (as it is when it has that many)."""
    return x if x.shape[0] >= rows else torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])


def _linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    return F.linear(x, weight, bias) if packed is None else mkldnn_linear(x, packed, bias)


# Decode rows of a dense CPU engine (--weight-quant none): a step's few rows, whose bits must not
# depend on how many sequences decode together. Where `row_block()` is 0 (AVX2) one call padded to
# MIN_GEMM_ROWS already promises it. On AVX-512 only calls of one size do: bf16 rows go in calls of
# exactly DECODE_BLOCK_BF16 (the last padded), fp32 rows one call each (MKL's GEMV), up to
# MAX_DECODE_ROWS; more rows than that (a --max-num-seqs above the CPU default of 16, or the quality
# scorer's prompt rows through the LM head) go as prompt rows do. A decode step is bound by reading
# the weights, so a few rows cost about one: ms a step of SmolLM2's shapes (30 layers' projections
# from DRAM and the LM head) by rows in one call, 2 threads (scripts/dense_decode_rows.py):
#   AMX Xeon          bf16 1: 31.3, 2: 28.6, 4: 29.1, 8: 30.9, 16: 28.5; fp32 1: 22.6, 2: 26.8, 4: 46.2, 8: 62.8
#   AVX512-BF16 EPYC  bf16 1: 19.3, 2: 22.8, 4: 26.1, 8: 28.2, 16: 34.2; fp32 1: 44.5, 2: 83.5, 4: 65.4, 8: 58.0
# (4 bf16 rows cost the EPYC up to 1.35x one row in these GEMMs; end to end its decode was unchanged
# within the VM's noise, docs/numerics.md.)
DECODE_BLOCK_BF16 = 4
MAX_DECODE_ROWS = 16


def decode_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear of a decode step's rows, each row's bits independent of the rows beside it."""
    if not row_block() or x.shape[0] > MAX_DECODE_ROWS:
        return _dense_rows(x, weight, bias, x.dtype)
    block = DECODE_BLOCK_BF16 if weight.dtype == torch.bfloat16 else 1
    return _dense_rows(x, weight, bias, x.dtype, block=block)


class DenseRowsLinear(nn.Linear):
    """A dense CPU engine's linear (--weight-quant none): prompt rows as `_dense_rows` computes them
    (`row_block()`'s calls), a decode step's rows as `decode_rows` does; either way a row's bits
    depend on nothing but the row. torch's own CPU GEMMs pick their kernel by row count, so on a
    Xeon with AMX a bf16 prompt's KV depended on where a prefix-cache hit split it (the crash
    harness's cached turn answered otherwise than the cold server), and any row on what shared its
    step. The parameters are the wrapped layer's own."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        assert linear.weight.device.type == "cpu", "CPU only"
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = pack_dense_weight(self.weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if step_computes_prompt():
            return _dense_rows(x, self.weight, self.bias, x.dtype, self.packed)
        return decode_rows(x, self.weight, self.bias)


class DenseRowsHead(nn.Module):
    """The LM head of a dense CPU engine (`head_quant`): one row per sampling sequence, as decode rows.
    It holds the head's (or the tied embedding's) tensors without registering them again."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return decode_rows(x, self.weight, self.bias)


def apply_dense_rows(model: nn.Module) -> int:
    """Wrap every plain nn.Linear of the decoder (`model.model`) and the LM head of a dense CPU engine
    in DenseRowsLinear (the head in DenseRowsHead), in place; returns how many projections were
    wrapped. Tensor-parallel layers (the other subclasses of nn.Linear and MergedLinear) and a vision
    tower beside the decoder stay as they are. bf16 weights are also packed for 128-row prompt calls
    (`pack_dense_weight`): a second copy of each, as the low-bit engines keep."""
    head = getattr(model, "lm_head", None)
    targets = _decoder_linears(model, lambda child: type(child) in (nn.Linear, MergedLinear))
    for parent, name, child in targets:
        setattr(parent, name, DenseRowsLinear(child))
    if hasattr(model, "head_quant") and model.head_quant is None:
        weight = model.model.embed_tokens.weight if head is None else head.weight
        bias = None if head is None or head.bias is None else head.bias.data
        model.head_quant = DenseRowsHead(weight.data, bias)
    return len(targets)


def mkldnn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear on a weight that `pack_dense_weight` packed (torch.compile's CPU linear does the same)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_dense_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A bf16 weight [out, in] reordered once into oneDNN's layout for ROW_BLOCK-row calls, on a CPU
    that takes fixed blocks (`row_block()`), or None: other dtypes, or no oneDNN bf16 packing here
    (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT). Unpacked, every block call reorders the whole
    weight: on the AMX host a 64-row call of a 1536 x 576 bf16 weight took 0.22 ms, twice the
    0.11 ms per 64 rows of one 2048-row call (packed: 0.17 ms). KVSERVE_DENSE_PACK=0 turns it off (A/B)."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or not row_block():
        return None
    if not switches().is_dense_pack_enabled:
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, ROW_BLOCK)
    except (RuntimeError, AttributeError):  # no bf16 packing on this CPU or torch build
        return None


def default_max_quant_rows(scheme: WeightQuant, dtype: torch.dtype) -> int:
    return MAX_QUANT_ROWS_FP32 if dtype == torch.float32 else MAX_QUANT_ROWS[scheme]


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (int8 [out, in], bf16 scales [out]): symmetric per output row."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(torch.bfloat16)


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] -> (packed uint8, bf16 scales_and_zeros [in/32, out, 2]).

    torch's kernel computes w = (q - 8) * scale + zero, so zero = min + 8 * scale.
    """
    out_features, in_features = weight.shape
    if in_features % INT4_GROUP_SIZE:
        raise ValueError(f"int4 needs the input dim divisible by {INT4_GROUP_SIZE}, got {in_features}")
    w = weight.float().view(out_features, -1, INT4_GROUP_SIZE)  # [out, groups, 32]
    w_min, w_max = w.amin(dim=-1), w.amax(dim=-1)  # [out, groups]
    scale = ((w_max - w_min) / 15).clamp(min=1e-10)
    q = torch.round((w - w_min[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.view(out_features, in_features), 1)
    zero = w_min + 8 * scale
    scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, scales_and_zeros


def apply_weight_quant(
    model: nn.Module,
    scheme: WeightQuant,
    *,
    quantize_head: bool = True,
    int8_prefill: bool = False,
    bf16_prefill: bool = False,
) -> int:
    """Wrap every nn.Linear of the decoder (`model.model`; of `model` itself where it has none) and
    the LM head in place; returns how many were wrapped. A vision tower beside the decoder stays
    dense: it runs once per image on many rows, where low-bit weights save nothing and cost accuracy
    (llama.cpp keeps an mmproj at f16 too).
    int8_prefill: fp32 int4 layers also run prefill on the int4 x int8 GEMM (lowbit_cpu.lowbit_gemm)."""
    if scheme == "none":
        return 0
    head = getattr(model, "lm_head", None)
    targets = _decoder_linears(model, lambda child: isinstance(child, nn.Linear))
    for parent, name, child in targets:
        # Under bf16_prefill the gated MLP stays in bf16 between its two GEMMs (activation included):
        # an fp32 round trip of its 2 x intermediate-wide output would be most of the casts a bf16
        # prompt batch pays (profiled in docs/benchmarks/history.md).
        layer = WeightOnlyLinear(
            child.weight.data, _bias(child), scheme, int8_prefill=int8_prefill, bf16_prefill=bf16_prefill,
            keep_prefill_dtype=name == "gate_up_proj",
        )  # fmt: skip
        setattr(parent, name, layer)
    if quantize_head and hasattr(model, "head_quant"):
        # The head is the single largest GEMV (vocab x hidden); int8 keeps its logits precise.
        weight = model.model.embed_tokens.weight if head is None else head.weight
        model.head_quant = WeightOnlyLinear(
            weight.data, None, "int8", quantize_input=False, prompt_dense=False
        )
    return len(targets)


def _decoder_linears(
    model: nn.Module, takes: Callable[[nn.Module], bool]
) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, name, layer) of the decoder's (`model.model`'s, else `model`'s) layers that `takes`,
    the LM head aside."""
    head = getattr(model, "lm_head", None)
    decoder = getattr(model, "model", model)
    return [
        (parent, name, child)
        for parent in decoder.modules()
        for name, child in parent.named_children()
        if takes(child) and child is not head
    ]


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.data
