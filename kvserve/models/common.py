"""The decoder-only model every family shares: the pre-norm decoder layer, the layer stack, and
`CausalLMBase`, which implements the runner's `CausalLM` protocol. Family files subclass and
override only their deltas.

Module attribute names follow HF checkpoints (`model.layers.N.self_attn.o_proj.weight`)
so weight loading is the identity map except for the fused projections:
q/k/v -> `qkv_proj` and gate/up -> `gate_up_proj` (see `CausalLMBase.map_hf_name`).

Forwards are the math; which kernels run it is bound by `CausalLMBase.select_kernels` whenever what
decides it changes (the attention backend, the KV caches, the weights' kind, the fused-op switch):
each layer's fused form (fused_layers.py), its attention's fused kernels (blocks.py) and the
one-call CPU decode stack (decode_stack.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.models.blocks import MLP, Attention
from kvserve.models.config import LayerType, ModelArchConfig
from kvserve.models.decode_stack import CpuDecodeStack
from kvserve.models.fused_layers import GemvLayer, LayerNorms, LayerStep, LowbitLayer, fused_form
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.embedding import Embedding
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.rotary import OnDemandRotary, RotaryEmbedding

RopeTables = dict[LayerType, tuple[torch.Tensor, torch.Tensor]]  # layer type -> (cos, sin)

# HF projection name -> (our fused module, shard index inside it).
FUSED_SHARDS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class DecoderLayer(nn.Module):
    """Pre-norm block (Llama/Qwen): x + attn(norm(x)), then h + mlp(norm(h)). Families with other
    norms (Gemma 3) override `forward` and `norms`."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, self_attn: Attention) -> None:
        super().__init__()
        self.layer_type = arch.layer_type(layer_idx)
        self.self_attn = self_attn
        self.mlp = MLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        # This layer's fused form for the current kernels (bind_kernels); None: the modules' math.
        self.fused: GemvLayer | LowbitLayer | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn_out = self.self_attn(self.input_layernorm(x), cos, sin)
        normed, h = self.post_attention_layernorm.forward_with_residual(attn_out, x)  # h = x + attn
        return h + self.mlp(normed)

    def norms(self) -> LayerNorms:
        """Where forward applies its norms, for the fused forms."""
        return LayerNorms(self.input_layernorm, None, self.post_attention_layernorm, None)

    def bind_kernels(self, dtype: torch.dtype) -> None:
        self.self_attn.bind_kernels(dtype)
        self.fused = fused_form(self.self_attn, self.mlp, self.norms(), dtype, self)


class DecoderStack(nn.Module):
    """HF's `model.*` submodule: embeddings, layers, final norm."""

    def __init__(self, embed_tokens: Embedding, layers: list[DecoderLayer], norm: RMSNorm) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        # What runs each layer (the layer or its fused form) and, where every layer is low-bit, the
        # one-call CPU decode of them all; both set by bind_kernels.
        self._layer_steps: list[LayerStep] = list(layers)
        self.fused_stack: CpuDecodeStack | None = None
        self.use_fused_stack = True  # False: the per-layer path always (A/B scripts, tests)

    def forward(
        self, input_ids: torch.Tensor, rope: RopeTables, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`inputs_embeds` [num_tokens, hidden_size], where given, replaces the embedding of
        `input_ids` (image rows merged in by a vision model)."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        out = None if self.fused_stack is None else self.fused_stack.forward(x, rope)
        if out is None:  # no fused stack, or a step it does not cover
            for layer, step in zip(self.layers, self._layer_steps):
                x = step(x, *rope[layer.layer_type])
            out = x
        return self.norm(out)

    def bind_kernels(self, dtype: torch.dtype) -> None:
        layers: list[DecoderLayer] = list(self.layers)
        for layer in layers:
            layer.bind_kernels(dtype)
        self._layer_steps = [layer if layer.fused is None else layer.fused for layer in layers]
        lowbit = [layer.fused for layer in layers if isinstance(layer.fused, LowbitLayer)]
        self.fused_stack = None
        if self.use_fused_stack and len(lowbit) == len(layers):
            self.fused_stack = CpuDecodeStack.build(lowbit, [layer.layer_type for layer in layers])


class CausalLMBase(nn.Module):
    """The `CausalLM` protocol for a decoder-only stack; families override the `build_*` hooks."""

    def __init__(self, arch: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.arch = arch
        layers = [self.build_layer(arch, i, backend) for i in range(arch.num_hidden_layers)]
        self.attention_backend = backend
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
        self.rotary = nn.ModuleDict({lt: self._rotary(arch, lt) for lt in layer_types})

    # -- family hooks ---------------------------------------------------------------------

    def build_layer(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> DecoderLayer:
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

    def _rotary(self, arch: ModelArchConfig, layer_type: LayerType) -> nn.Module:
        """The family's rotary embedding; under on-demand RoPE scaling, beside the one it builds for
        the architecture as trained (rows pick theirs: OnDemandRotary)."""
        scaled = self.build_rotary(arch, layer_type)
        if not arch.rope_scaling_on_demand:
            return scaled
        return OnDemandRotary(scaled, self.build_rotary(arch.trained_arch, layer_type))

    # -- CausalLM protocol ----------------------------------------------------------------

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        dtype = self.model.embed_tokens.weight.dtype
        rope: RopeTables = {lt: emb(positions, dtype) for lt, emb in self.rotary.items()}
        return self.model(input_ids, rope, inputs_embeds)

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
        if not hidden.is_cuda:  # the GEMV is Triton's, which is not installed everywhere the CPU runs
            return None
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
        self.attention_backend = backend
        self.select_kernels()

    def bind_kv_caches(self, caches: list[torch.Tensor]) -> None:
        num_layers, num_kv_heads, head_dim = self.kv_cache_spec()
        assert len(caches) == num_layers, f"expected {num_layers} caches, got {len(caches)}"
        for layer, cache in zip(self.model.layers, caches):
            assert cache.dim() == 5 and cache.shape[0] == 2 and cache.shape[-2:] == (num_kv_heads, head_dim)
            layer.self_attn.kv_cache = cache
        self.select_kernels()

    def select_kernels(self) -> None:
        """Bind every layer's kernels to what decides them: the backend, the caches, the weights'
        kind and dtype, the fused-op switches (fused_ops.ENABLED, cpu_ext). Setting the backend or
        the caches calls it; call it after changing the others (apply_weight_quant, a switch)."""
        self.model.bind_kernels(self.model.embed_tokens.weight.dtype)

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
