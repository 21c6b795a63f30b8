"""This rank's KV pool: its context and size (`resolve_kv_pool`) and the runner that holds it
(`build_runner`). Every tensor-parallel rank runs both alike (distributed/worker.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from kvserve.config import EngineConfig
from kvserve.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from kvserve.models.layers import cpu_ext
from kvserve.models.layers.quant import apply_dense_rows, apply_weight_quant, default_max_quant_rows
from kvserve.models.loaded import LoadedModel

logger = logging.getLogger(__name__)

# Auto-sized KV pools stay under this on CPU so a laptop keeps its RAM; --kv-cache-memory-mb overrides.
_AUTO_KV_CAP_MB = 4096
# ... and under this share of the machine's memory (or its cgroup's limit). The pool's pages are mapped
# as the prefix cache first writes them, so RSS climbs to model + pool over hours of serving: on a small
# machine a pool sized for 16 full contexts would end in the OOM killer long after start-up.
_AUTO_KV_RAM_SHARE = 0.25
_CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


def auto_kv_cap_bytes(memory_bytes: int | None) -> int:
    """The largest pool the CPU auto size takes on a machine (or cgroup) of `memory_bytes`."""
    cap = _AUTO_KV_CAP_MB * 2**20
    return cap if memory_bytes is None else min(cap, int(memory_bytes * _AUTO_KV_RAM_SHARE))


def memory_limit_bytes() -> int | None:
    """Physical memory, or the cgroup v2 limit where one is set and lower; None where unknown."""
    try:
        limits = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    except (ValueError, OSError):
        limits = []
    try:
        text = _CGROUP_MEMORY_MAX.read_text().strip()
    except OSError:
        text = "max"
    if text.isdigit():
        limits.append(int(text))
    return min(limits, default=None)


def resolve_kv_pool(config: EngineConfig, loaded: LoadedModel) -> tuple[int, int]:
    """(max_model_len, num_blocks) of this rank's KV pool; applies --weight-quant first. Every
    tensor-parallel rank runs it (on CUDA its profiling forward is a collective)."""
    max_model_len = _resolve_max_model_len(config, loaded)
    if config.device == "cpu" and config.dtype == "float32":
        # Build (first run: a minute or more) or load the CPU decode kernels now, not in the
        # first request's decode step.
        logger.info("CPU decode kernels: loading (the first start on a machine compiles them, ~1-3 min)")
        logger.info("CPU decode kernels: %s", "on" if cpu_ext.load() is not None else "off")
    if apply_weight_quant(
        loaded.model, config.weight_quant, int8_prefill=config.int8_prefill, bf16_prefill=config.bf16_prefill
    ):
        logger.info(
            "weight-only %s for batches of <= %d tokens%s",
            config.weight_quant,
            default_max_quant_rows(config.weight_quant, config.torch_dtype),
            "; larger ones (prefill) on the int4 x int8 GEMM (--int8-prefill)" if config.int8_prefill else "",
        )
    elif config.device == "cpu" and config.tensor_parallel_size == 1:
        # Dense weights: torch's CPU GEMMs pick their kernel by row count, so the rows go in calls whose
        # bits depend on nothing but the row (quant.DenseRowsLinear).
        apply_dense_rows(loaded.model)
    return max_model_len, _resolve_num_blocks(config, loaded, max_model_len)


def build_runner(
    config: EngineConfig, loaded: LoadedModel, num_blocks: int, max_model_len: int
) -> ModelRunner:
    """The runner every rank builds alike (on CUDA, its graph captures are collectives too)."""
    return ModelRunner(
        loaded,
        num_blocks,
        config.cache.block_size,
        torch.device(config.device),
        kv_dtype=config.torch_kv_dtype,
        attention_backend=config.attention_backend,
        enforce_eager=config.enforce_eager,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_model_len=max_model_len,
        # --bf16-prefill: the prompt rows' attention in bf16 too (torch_ref.py), where the weights are
        # bf16 for the same reason (a CPU with AVX512-BF16 or AMX).
        prefill_attention_dtype=torch.bfloat16 if config.bf16_prefill else None,
        encoder_cache_bytes=config.cache.encoder_cache_mb * 2**20,
    )


def _resolve_max_model_len(config: EngineConfig, loaded: LoadedModel) -> int:
    if config.max_model_len <= 0:
        return loaded.max_model_len
    if config.max_model_len > loaded.max_model_len:
        # The loader extends the context (models/rope_scaling.py) when it is given the request; a
        # silent clamp here would turn every long request into a 400.
        raise ValueError(
            f"--ctx {config.max_model_len} exceeds the context the model was loaded for "
            f"({loaded.max_model_len}); load it with load_model(..., context=config.context_request)"
        )
    return config.max_model_len


def _cuda_kv_budget(config: EngineConfig, loaded: LoadedModel) -> int:
    from kvserve.engine.runner.device_setup import cuda_kv_budget_bytes, select_attention_backend

    # Profile with the kernels the runner will use: their temporaries count.
    select_attention_backend(loaded.model, torch.device(config.device), config.attention_backend)
    return cuda_kv_budget_bytes(
        loaded.model,
        utilization=config.cache.gpu_memory_utilization,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        block_size=config.cache.block_size,
        use_graphs=not config.enforce_eager,
    )


def _resolve_num_blocks(config: EngineConfig, loaded: LoadedModel, max_model_len: int) -> int:
    block_size = config.cache.block_size
    per_block = kv_bytes_per_block(loaded, block_size, config.torch_kv_dtype)
    blocks_per_seq = -(-max_model_len // block_size)
    if config.cache.kv_cache_memory_mb > 0:
        num_blocks = config.cache.kv_cache_memory_mb * 2**20 // per_block
    elif config.device.startswith("cuda"):
        num_blocks = _cuda_kv_budget(config, loaded) // per_block
    else:
        wanted = blocks_per_seq * config.scheduler.max_num_seqs
        num_blocks = min(wanted, auto_kv_cap_bytes(memory_limit_bytes()) // per_block)
    # At least one full-context sequence must fit, else a long prompt could never be scheduled.
    num_blocks = max(num_blocks, blocks_per_seq + 1)
    return int(num_blocks)
