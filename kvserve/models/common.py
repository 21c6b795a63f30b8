"""Blocks shared by every family: GQA attention over the paged cache, gated MLP, the
pre-norm decoder layer, and `CausalLMBase`, which implements the runner's `CausalLM`
protocol. Family files subclass and override only their deltas.

Module attribute names follow HF checkpoints (`model.layers.N.self_attn.o_proj.weight`)
so weight loading is the identity map except for the fused projections:
q/k/v -> `qkv_proj` and gate/up -> `gate_up_proj` (see `CausalLMBase.map_hf_name`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.models.config import LayerType, ModelArchConfig
from kvserve.models.decode_stack import CpuDecodeStack
from kvserve.models.layers import lowbit_cpu
from kvserve.models.layers.activation import get_gated_activation
from kvserve.models.layers.attention import cpu_decode
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.attention.metadata import get_attention_metadata, step_computes_prompt
from kvserve.models.layers.embedding import Embedding
from kvserve.models.layers.linear import MergedLinear
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.quant import WeightOnlyLinear
from kvserve.models.layers.rotary import RotaryEmbedding, apply_rotary

RopeTables = dict[LayerType, tuple[torch.Tensor, torch.Tensor]]  # layer type -> (cos, sin)

# HF projection name -> (our fused module, shard index inside it).
FUSED_SHARDS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class Attention(nn.Module):
    def __init__(
        self,
        arch: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm_offset: float | None = None,  # None: no q/k norm; else the RMSNorm weight offset
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(arch.hidden_size, (q_size, kv_size, kv_size), bias=qkv_bias)
        self.o_proj = nn.Linear(q_size, arch.hidden_size, bias=o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_offset is not None:
            self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, qk_norm_offset)
            self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, qk_norm_offset)
        self.layer_type = arch.layer_type(layer_idx)
        self.sliding_window = arch.sliding_window if self.layer_type == "sliding_attention" else None
        self.scale = (arch.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # [2, num_blocks, block_size, num_kv_heads, head_dim]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend_qkv(self.qkv_proj(x), cos, sin))

    def attend_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Projected [num_tokens, (H + 2 KV) * D] -> attention output [num_tokens, H * D]: RoPE, the
        KV write and paged attention (everything between qkv_proj and o_proj)."""
        num_tokens = qkv.shape[0]
        num_heads, num_kv_heads = self.num_heads, self.num_kv_heads
        qkv = qkv.view(num_tokens, num_heads + 2 * num_kv_heads, self.head_dim)
        v = qkv[:, num_heads + num_kv_heads :]  # [num_tokens, num_kv_heads, head_dim]
        assert self.kv_cache is not None, "bind_kv_caches() before forward"
        metadata = get_attention_metadata()
        if self.backend.name == "torch_ref":
            # fp32 CPU decodes: (q/k norm,) RoPE, KV write and paged attention in one C++ call
            # (cpu_decode.py).
            q_norm, k_norm = self.q_norm, self.k_norm
            fused = cpu_decode.attend_qkv(
                qkv.view(num_tokens, -1), cos, sin, self.kv_cache, metadata,
                num_heads, num_kv_heads, self.scale, self.sliding_window,
                None if q_norm is None else q_norm.scale(), None if k_norm is None else k_norm.scale(),
                1e-6 if q_norm is None else q_norm.eps,
            )  # fmt: skip
            if fused is not None:
                return fused
        if self.q_norm is None and self._fuse_kv_write(qkv, cos, sin):
            # RoPE of q and k and the KV write in one Triton launch (fused_ops.rotary).
            from kvserve.models.layers import fused_ops

            qk_heads = qkv[:, : num_heads + num_kv_heads]
            qk = fused_ops.rotary(
                qk_heads, cos, sin, kv_cache=self.kv_cache, v=v, slot_mapping=metadata.slot_mapping
            )
            q, k = qk[:, :num_heads], qk[:, num_heads:]
        elif self.q_norm is None:
            # One rotary pass over q and k together: they are adjacent heads of the fused output.
            qk = apply_rotary(qkv[:, : num_heads + num_kv_heads], cos, sin)
            q, k = qk[:, :num_heads], qk[:, num_heads:]
            self.backend.write_kv(self.kv_cache, k, v, metadata.slot_mapping)
        else:
            assert self.k_norm is not None
            q = apply_rotary(self.q_norm(qkv[:, :num_heads]), cos, sin)  # [num_tokens, num_heads, head_dim]
            k = apply_rotary(self.k_norm(qkv[:, num_heads : num_heads + num_kv_heads]), cos, sin)
            self.backend.write_kv(self.kv_cache, k, v, metadata.slot_mapping)
        out = self.backend.attend(
            q, k, v, self.kv_cache, metadata, scale=self.scale, sliding_window=self.sliding_window
        )  # [num_tokens, num_heads, head_dim]
        return out.reshape(num_tokens, num_heads * self.head_dim)

    def _fuse_kv_write(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """The Triton backend on CUDA with the fused small ops (the conditions apply_rotary checks)."""
        if not qkv.is_cuda or self.backend.name != "triton":
            return False
        from kvserve.models.layers import fused_ops

        return fused_ops.ENABLED and cos.is_contiguous() and sin.is_contiguous()


class MLP(nn.Module):
    def __init__(self, arch: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(arch.hidden_size, (arch.intermediate_size,) * 2, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)
        self.act_name = arch.hidden_act
        self.act = get_gated_activation(arch.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LowbitNorms(NamedTuple):
    """A decoder layer's norms as the fused low-bit path applies them: before attention, after it
    (Gemma; before the residual add), before the MLP, after it (Gemma)."""

    attn_in: RMSNorm
    attn_out: RMSNorm | None
    mlp_in: RMSNorm
    mlp_out: RMSNorm | None


class DecoderLayer(nn.Module):
    """Pre-norm block (Llama/Qwen): x + attn(norm(x)), then h + mlp(norm(h)). Families with other
    norms (Gemma 3) override `_forward_dense` and `lowbit_norms`."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, self_attn: Attention) -> None:
        super().__init__()
        self.layer_type = arch.layer_type(layer_idx)
        self.self_attn = self_attn
        self.mlp = MLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self._can_run_gemv(x):
            return self._forward_gemv(x, cos, sin)
        if self._can_run_lowbit(x):
            return self._forward_lowbit(x, cos, sin)
        return self._forward_dense(x, cos, sin)

    def _forward_dense(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn_out = self.self_attn(self.input_layernorm(x), cos, sin)
        normed, h = self.post_attention_layernorm.forward_with_residual(attn_out, x)  # h = x + attn
        return h + self.mlp(normed)

    def _can_run_gemv(self, x: torch.Tensor) -> bool:
        if not x.is_cuda or x.shape[0] != 1:
            return False
        from kvserve.models.layers import fused_ops, gemv  # Triton: imported on CUDA only

        # Plain nn.Linear only: weight-quantized layers (--weight-quant) keep their own path.
        linears = (self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)
        return (
            fused_ops.ENABLED
            and gemv.can_use_gemv(x, self.self_attn.qkv_proj.weight)
            and all(type(m) in (nn.Linear, MergedLinear) for m in linears)
            and self.mlp.act_name in ("silu", "swish")
            and self.input_layernorm.offset == 0.0
            and self.post_attention_layernorm.offset == 0.0
        )

    def _forward_gemv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One token (single-stream decode) in four GEMV launches plus attention: each norm is
        fused into the projection after it, the residual adds and SiLU-mul into the one before."""
        from kvserve.models.layers import gemv

        attn, mlp = self.self_attn, self.mlp
        in_norm, post_norm = self.input_layernorm, self.post_attention_layernorm
        qkv = gemv.gemv(
            x, attn.qkv_proj.weight, bias=attn.qkv_proj.bias, norm_weight=in_norm.weight, eps=in_norm.eps
        )
        out = attn.attend_qkv(qkv, cos, sin)  # [1, H * D]
        h = gemv.gemv(out, attn.o_proj.weight, bias=attn.o_proj.bias, residual=x)  # x + attn
        act = gemv.gemv(
            h, mlp.gate_up_proj.weight, norm_weight=post_norm.weight, eps=post_norm.eps, gated=True
        )
        return gemv.gemv(act, mlp.down_proj.weight, residual=h)  # h + mlp

    def _can_run_lowbit(self, x: torch.Tensor) -> bool:
        """fp32 CPU decode with every projection on lowbit_cpu's kernel (--weight-quant on fp32); never
        for a step that computes prompt tokens (metadata.step_computes_prompt)."""
        if x.is_cuda or x.dtype != torch.float32:
            return False
        return self.is_lowbit() and x.shape[0] <= self.max_lowbit_rows() and not step_computes_prompt()

    def is_lowbit(self) -> bool:
        """Every projection has lowbit_cpu's packed weights and the kernel has the MLP's activation."""
        return (
            all(isinstance(m, WeightOnlyLinear) and m.bits is not None for m in self._linears())
            and self.mlp.act_name in lowbit_cpu.ACTIVATIONS
        )

    def lowbit_norms(self) -> LowbitNorms:
        return LowbitNorms(self.input_layernorm, None, self.post_attention_layernorm, None)

    def max_lowbit_rows(self) -> int:
        return min(m.max_quant_rows for m in self._linears())

    def _linears(self) -> tuple[nn.Module, ...]:
        return (self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)

    def _forward_lowbit(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """_forward_gemv's four fused projections, on the CPU's low-bit kernel (with Gemma's output
        norms fused in before the residual adds)."""
        attn, mlp = self.self_attn, self.mlp
        attn_in, attn_out, mlp_in, mlp_out = self.lowbit_norms()
        qkv = attn.qkv_proj.lowbit(x, norm_weight=attn_in.scale(), eps=attn_in.eps)
        out = attn.attend_qkv(qkv, cos, sin)  # [num_tokens, H * D]
        h = attn.o_proj.lowbit(out, residual=x, **_post_norm(attn_out))  # x + attn
        act = mlp.gate_up_proj.lowbit(
            h, norm_weight=mlp_in.scale(), eps=mlp_in.eps, gated=True, act=mlp.act_name
        )
        return mlp.down_proj.lowbit(act, residual=h, **_post_norm(mlp_out))  # h + mlp


def _post_norm(norm: RMSNorm | None) -> dict[str, Any]:
    return {} if norm is None else {"post_norm": norm.scale(), "post_eps": norm.eps}


class DecoderStack(nn.Module):
    """HF's `model.*` submodule: embeddings, layers, final norm."""

    def __init__(self, embed_tokens: Embedding, layers: list[nn.Module], norm: RMSNorm) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        # Built at the first decode that can use it; reset when the caches or kernels change.
        self._decode_stack: CpuDecodeStack | None = None
        self._decode_stack_built = False

    def forward(self, input_ids: torch.Tensor, rope: RopeTables) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        stack = self._lowbit_decode_stack(x)
        out = stack.forward(x, rope) if stack is not None else None
        if out is not None:
            return self.norm(out)
        for layer in self.layers:
            x = layer(x, *rope[layer.layer_type])
        return self.norm(x)

    def reset_decode_stack(self) -> None:
        self._decode_stack, self._decode_stack_built = None, False

    def _lowbit_decode_stack(self, x: torch.Tensor) -> CpuDecodeStack | None:
        """The one-call C++ decode stack where every layer runs _forward_lowbit (fp32 CPU, low-bit)."""
        if x.is_cuda or x.dtype != torch.float32:
            return None
        if not self._decode_stack_built:
            self._decode_stack_built = True
            layers = list(self.layers)
            if all(isinstance(layer, DecoderLayer) and layer.is_lowbit() for layer in layers):
                self._decode_stack = CpuDecodeStack.build(layers)
        return self._decode_stack


class CausalLMBase(nn.Module):
    """The `CausalLM` protocol for a decoder-only stack; families override the `build_*` hooks."""

    def __init__(self, arch: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.arch = arch
        layers = [self.build_layer(arch, i, backend) for i in range(arch.num_hidden_layers)]
        self.attention_backend_name = backend.name
        self.model = DecoderStack(self.build_embedding(arch), layers, self.build_norm(arch, arch.hidden_size))
        self.lm_head: nn.Linear | None = None
        self.head_quant: nn.Module | None = None  # set by layers.quant.apply_weight_quant
        # Tensor parallel: joins the ranks' vocabulary shards of the logits (distributed/sharding.py).
        self.logits_gather: nn.Module | None = None
        if not arch.tie_word_embeddings:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        # The greedy head's atomic-max slots per device (compute_logits_and_greedy).
        self._argmax_slots: dict[torch.device, torch.Tensor] = {}
        layer_types = sorted({arch.layer_type(i) for i in range(arch.num_hidden_layers)})
        self.rotary = nn.ModuleDict({lt: self.build_rotary(arch, lt) for lt in layer_types})

    # -- family hooks ---------------------------------------------------------------------

    def build_layer(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> nn.Module:
        attn = Attention(arch, layer_idx, backend, qkv_bias=arch.attention_bias, o_bias=arch.attention_bias)
        return DecoderLayer(arch, layer_idx, attn)

    def build_embedding(self, arch: ModelArchConfig) -> Embedding:
        return Embedding(arch.vocab_size, arch.hidden_size)

    def build_norm(self, arch: ModelArchConfig, dim: int) -> RMSNorm:
        return RMSNorm(dim, arch.rms_norm_eps)

    def build_rotary(self, arch: ModelArchConfig, layer_type: LayerType) -> RotaryEmbedding:
        return RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling_dict)

    def strip_hf_prefix(self, hf_name: str) -> str | None:
        """HF checkpoint name -> name in this module tree (before fusion); None skips the tensor."""
        return hf_name

    # -- CausalLM protocol ----------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        dtype = self.model.embed_tokens.weight.dtype
        rope: RopeTables = {lt: emb(positions, dtype) for lt, emb in self.rotary.items()}
        return self.model(input_ids, rope)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        fused = self.compute_logits_and_greedy(hidden)
        if fused is not None:
            return fused[0]
        if self.head_quant is not None:
            logits = self.head_quant(hidden).float()  # [n, vocab_size]
        else:
            weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = F.linear(hidden, weight).float()  # [n, vocab_size]
        if self.logits_gather is not None:
            logits = self.logits_gather(logits)  # [n, vocab_size / tp] -> [n, vocab_size]
        cap = self.arch.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One token's float32 logits [1, vocab] and their argmax [1] from one fused GEMV
        (layers/gemv.py: logits_argmax), or None where that path does not apply. compute_logits
        takes it too, so a token's logits are the same bits whether or not its argmax is wanted."""
        from kvserve.models.layers import fused_ops, gemv

        plain = (
            self.head_quant is None
            and self.logits_gather is None
            and self.arch.final_logit_softcapping is None
        )
        if not (plain and gemv.HEAD_ENABLED and fused_ops.ENABLED):
            return None
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if not gemv.can_use_gemv(hidden, weight):
            return None
        slots = self._argmax_slots.get(hidden.device)
        if slots is None:  # allocated at the first (eager, warm-up) call, never inside a graph capture
            slots = self._argmax_slots[hidden.device] = gemv.empty_argmax_slots(hidden.device)
        return gemv.logits_argmax(hidden, weight, slots)

    def kv_cache_spec(self) -> tuple[int, int, int]:
        # The layers' own head count: a tensor-parallel rank caches only its KV heads.
        num_kv_heads = self.model.layers[0].self_attn.num_kv_heads
        return self.arch.num_hidden_layers, num_kv_heads, self.arch.head_dim

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        """Swap the paged-attention kernels of every layer (the runner picks them per device)."""
        for layer in self.model.layers:
            layer.self_attn.backend = backend
        self.model.reset_decode_stack()
        self.attention_backend_name = backend.name

    def bind_kv_caches(self, caches: list[torch.Tensor]) -> None:
        num_layers, num_kv_heads, head_dim = self.kv_cache_spec()
        assert len(caches) == num_layers, f"expected {num_layers} caches, got {len(caches)}"
        for layer, cache in zip(self.model.layers, caches):
            assert cache.dim() == 5 and cache.shape[0] == 2 and cache.shape[-2:] == (num_kv_heads, head_dim)
            layer.self_attn.kv_cache = cache
        self.model.reset_decode_stack()

    # -- weight loading -------------------------------------------------------------------

    def map_hf_name(self, hf_name: str) -> tuple[str, int | None] | None:
        """HF tensor name -> (parameter name, shard of a fused projection or None); None skips it."""
        name = self.strip_hf_prefix(hf_name)
        if name is None or name.endswith("rotary_emb.inv_freq"):
            return None
        if name == "lm_head.weight" and self.lm_head is None:
            return None  # tied checkpoints sometimes store the duplicate
        *module, proj, param = name.split(".")
        if proj in FUSED_SHARDS:
            fused, shard = FUSED_SHARDS[proj]
            return ".".join([*module, fused, param]), shard
        return name, None

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers after building on the meta device."""
        for emb in self.rotary.values():
            emb.reset_parameters()
