"""Per-device choices the runner makes once: the attention backend, and on CUDA the KV pool size
from free GPU memory after a profiling forward at the largest step size."""

from __future__ import annotations

import logging

import torch

from kvserve.config import AttentionBackendName
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.attention.metadata import AttentionMetadata, forward_context

logger = logging.getLogger(__name__)

# Reserve for the CUDA graphs' private pool (their activations and logits buffers).
GRAPH_MEMORY_BYTES = 2 << 30
_SLACK_BYTES = 512 << 20  # allocator fragmentation, cuBLAS workspaces, Triton launch temporaries


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def select_attention_backend(
    model: torch.nn.Module,
    device: torch.device,
    name: AttentionBackendName,
    prefill_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """Install the backend on every attention layer (idempotent); returns the installed one.
    `prefill_dtype`: the torch backend's dtype for prompt rows (bf16 under --bf16-prefill; None: the
    model's)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and triton_available() else "torch_ref"
    current: AttentionBackend = model.attention_backend
    if current.name == name and prefill_dtype is None:
        return current
    backend: AttentionBackend
    if name == "triton":
        if device.type != "cuda":
            raise ValueError("--attention-backend triton needs a CUDA device")
        from kvserve.models.layers.attention.triton_backend import TritonBackend

        backend = TritonBackend()
    else:
        from kvserve.models.layers.attention.torch_ref import TorchRefBackend

        backend = TorchRefBackend(prefill_dtype)
    model.set_attention_backend(backend)
    return backend


@torch.inference_mode()
def profile_peak_bytes(model: torch.nn.Module, num_tokens: int, num_logits: int, block_size: int) -> int:
    """Peak memory of one forward of a `num_tokens` prompt plus `num_logits` logits rows, beyond
    what is allocated now and excluding the scratch KV it writes."""
    device = next(model.parameters()).device
    num_layers, num_kv_heads, head_dim = model.kv_cache_spec()
    dtype = next(model.parameters()).dtype
    num_blocks = -(-num_tokens // block_size)
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    model.bind_kv_caches(caches)
    metadata = AttentionMetadata(
        block_size=block_size,
        num_decodes=0,
        slot_mapping=torch.arange(num_tokens, device=device),
        block_tables=torch.arange(num_blocks, device=device)[None],
        seq_lens=torch.tensor([num_tokens], device=device),
        query_start_loc_cpu=[0, num_tokens],
        seq_lens_cpu=[num_tokens],
        context_lens_cpu=[0],
    )
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    ids = torch.randint(0, 100, (num_tokens,), device=device)
    with forward_context(metadata):
        hidden = model(ids, torch.arange(num_tokens, device=device))
    logits = model.compute_logits(hidden[-min(num_logits, num_tokens) :])
    # The sampler's top-k/top-p path holds a few [rows, vocab] float32 copies.
    peak = torch.cuda.max_memory_allocated() - baseline + 3 * logits.numel() * 4
    del hidden, logits, caches
    torch.cuda.empty_cache()
    return peak


def cuda_kv_budget_bytes(
    model: torch.nn.Module,
    *,
    utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    use_graphs: bool,
) -> int:
    """Bytes left for the KV pool: utilization x total memory, minus what is in use now (weights,
    the CUDA context, other processes), the profiled activation peak and the graphs' reserve."""
    peak = profile_peak_bytes(model, max_num_batched_tokens, max_num_seqs, block_size)
    free, total = torch.cuda.mem_get_info()
    in_use = total - free
    reserve = peak + (GRAPH_MEMORY_BYTES if use_graphs else 0) + _SLACK_BYTES
    budget = int(total * utilization) - in_use - reserve
    logger.info(
        "GPU memory: %.1f GiB total, %.1f GiB in use, %.1f GiB activation peak -> %.1f GiB for KV",
        total / 2**30,
        in_use / 2**30,
        peak / 2**30,
        budget / 2**30,
    )
    if budget <= 0:
        raise ValueError("no GPU memory left for the KV cache; raise --gpu-memory-utilization")
    return budget
