"""The cache key: which engines may share KV.

Every block chain hash (the RAM prefix cache) and the disk tier's store identity include it, so
KV is reused only by an engine that computes the same bytes: same weights, dtype and arithmetic.
"""

from __future__ import annotations

from kvserve.config import EngineConfig


def cache_key(config: EngineConfig, fingerprint: str) -> str:
    """The key of a resolved `config` over the weights `fingerprint` names:
    `{fingerprint}:{dtype}:{weight_quant}[:int8-prefill|:bf16-prefill-attn-mlp][:kv-{kv_dtype}][:blocked-attn]`."""
    # KV computed with quantized weights differs from dense KV: never share blocks between them.
    # So does KV prefilled on other weights than the dense fp32 ones. The bf16 label names the
    # arithmetic (bf16 GEMMs, attention and MLP activation), so KV from a build that prefilled
    # with other bf16 arithmetic is never reused.
    bf16 = ":bf16-prefill-attn-mlp"
    prefill = ":int8-prefill" if config.int8_prefill else bf16 if config.bf16_prefill else ""
    # And KV held in another dtype than the compute (fp16 under fp32) is rounded KV.
    kv = f":kv-{config.cache.kv_dtype}" if config.cache.kv_dtype != config.dtype else ""
    # On the CPU, prompt rows attend in the C++ kernel that takes keys in blocks aligned to absolute
    # positions (csrc/prefill_attention.cpp): other bits than torch's SDPA, which computed the CPU's
    # prompt KV before it. (A CPU where the kernels cannot build still runs SDPA under this key, as
    # it runs torch's decode path beside the C++ one: the KV differs in its last bits only.)
    attn = ":blocked-attn" if config.device == "cpu" else ""
    return f"{fingerprint}:{config.dtype}:{config.weight_quant}{prefill}{kv}{attn}"
