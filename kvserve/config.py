"""Frozen configuration tree; `resolve()` fills every "auto" value once and logs the choice."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from kvserve.models.rope_scaling import ContextRequest, RopeScalingName

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DTypeName = Literal["auto", "float32", "bfloat16", "float16"]
KV_DTYPE_CHOICES = ("auto", "float32", "float16", "bfloat16")  # --kv-cache-dtype
WeightQuantName = Literal["none", "int8", "int4", "auto"]
AttentionBackendName = Literal["auto", "torch_ref", "triton"]


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    # RAM/VRAM for the paged KV pool; 0 = auto (CPU: enough for max_num_seqs full contexts, capped;
    # CUDA: what gpu_memory_utilization leaves after weights, activations and CUDA graphs).
    kv_cache_memory_mb: int = 0
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory this engine may use
    # The KV's dtype, in the RAM/VRAM pool and on disk (--kv-cache-dtype). "auto" (resolve()): float16
    # for a float32 engine on CPU, as llama.cpp's default KV: a long-context decode step is mostly
    # the attention's KV reads, and fp16 halves them (the C++ decode attention widens with F16C);
    # the disk tier stores and reloads the same bytes. Else the engine's own dtype.
    kv_dtype: DTypeName = "auto"
    # Device memory for vision-encoder outputs kept by image (runner/encoder_cache.py): ~200 of
    # SmolVLM's 17-tile images in bf16. Models without images never allocate it.
    encoder_cache_mb: int = 256


@dataclass(frozen=True)
class SharedKVConfig:
    """The KV tier shared by replicas (kvserve/kvstore/shared): a directory every replica mounts
    (NFS) or an S3 bucket, beside each replica's own disk tier."""

    location: str  # a directory, or s3://bucket[/prefix]
    endpoint_url: str | None = None  # an S3-compatible server's URL (SeaweedFS, MinIO); None: AWS's
    refresh_s: float = 10.0  # list the shared manifests this often in the background
    miss_refresh_s: float = 1.0  # and on a lookup that misses, at most this often
    # Save each finished turn (prompt + reply), so the session's next turn finds it on any replica,
    # also after the replica that served it died (which leaves no shutdown save).
    save_turns: bool = True


@dataclass(frozen=True)
class KVStoreConfig:
    """The disk KV tier (kvserve/kvstore): checkpoints that outlive the RAM cache and restarts."""

    directory: str  # created 0700; one server per directory
    budget_mb: int = 4096
    chunk_tokens: int = 256  # tokens per content-addressed chunk file (a multiple of block_size)
    min_tokens: int = 512  # shorter prefixes are cheaper to prefill than to load
    continued_interval_tokens: int = 10000  # rounded up to align_tokens: frontiers every 10,240 tokens
    align_tokens: int = 2048  # cold checkpoints without a chat boundary are cut to a multiple of this
    max_pending_saves: int = 4  # checkpoints copied out and waiting for the writer thread
    # ... and the bytes of their copies (one save is always taken when none is pending): a bound in
    # memory whatever the context length and the model's KV per token.
    max_pending_save_mb: int = 256
    # At start-up, read the most recently used checkpoints into the RAM pool (up to this fraction of
    # it) as free cached blocks, so a restart's first request finds its prefix in RAM instead of
    # reading it from disk on its critical path. 0 turns it off.
    preload_fraction: float = 0.5
    shared: SharedKVConfig | None = None  # a tier shared with other replicas, below this one


@dataclass(frozen=True)
class SchedulerConfig:
    """0 = auto (`resolve`): the device's defaults below."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    # The step's budget while some sequence is decoding (its streams wait for the whole step);
    # 0: max_num_batched_tokens. Only an automatic budget on CPU sets it lower (`resolve`).
    max_tokens_with_decodes: int = 0

    @property
    def budget_with_decodes(self) -> int:
        return self.max_tokens_with_decodes or self.max_num_batched_tokens


# (max_num_seqs, max_num_batched_tokens, the budget while sequences decode) by device.
# CPU: a step's cost grows with every token, so while streams decode a step stays at 512 tokens (their
# inter-token latency); a prompt prefilled with nothing decoding goes 2,048 tokens a step (llama.cpp's
# batch), which amortises each step's fixed costs (the prompt attention packs every visible key block
# per call): a 12,500-token prefill 1.23x faster than 512-token steps on 2 AMX cores
# (docs/benchmarks/history.md). CUDA: vLLM's serving defaults (256 sequences; an 8K-token step keeps
# a burst of 512-token prompts from waiting behind each other for long): decode up to 256 streams is
# nearly free on a GPU, and a small batch queues requests instead.
DEVICE_SCHEDULER_DEFAULTS = {"cpu": (16, 2048, 512), "cuda": (256, 8192, 8192)}


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2"
    # A GGUF model's vision projector (llama.cpp's mmproj file): a path, "auto" (the one mmproj*.gguf
    # beside the model file) or "none".
    mmproj: str = "auto"
    dtype: DTypeName = "auto"
    device: str = "auto"
    max_model_len: int = 0  # --ctx; 0 = the model's context length (capped by --kv-cache-memory-mb)
    # RoPE context extension (models/rope_scaling.py). None: the model's own scaling, and YaRN when
    # --ctx exceeds the trained context; "none" refuses such a --ctx instead.
    rope_scaling: RopeScalingName | None = None
    rope_scale: float = 0.0  # --rope-scale; 0 = --ctx / the original context
    yarn_orig_ctx: int = 0  # --yarn-orig-ctx; 0 = the model's trained context
    # CPU decode is memory-bound: low-bit weight copies for small batches (see models/layers/quant.py).
    # "auto" (the CLI's default) keeps the precision of a low-bit GGUF's layers: resolve_weight_quant().
    weight_quant: WeightQuantName = "none"
    # fp32 with --weight-quant int4: prefill on the int4 x int8 GEMM too (activations rounded to int8
    # per group of 32, as decode and llama.cpp do; ~1.5x faster prefill on AVX2, but it changed
    # SmolLM2's greedy answers, so it is opt-in; see docs/benchmarks/history.md).
    int8_prefill: bool = False
    # fp32 with --weight-quant int4/int8: the dense weights, which serve prompt-sized batches only, in
    # bf16 (oneDNN's bf16 GEMM; fast only with AVX512-BF16/AMX). `--dtype auto` turns it on there
    # (resolve()): the low-bit kernels decode, bf16 GEMMs prefill.
    bf16_prefill: bool = False
    attention_backend: AttentionBackendName = "auto"  # auto = triton on CUDA, torch_ref on CPU
    enforce_eager: bool = False  # CUDA: no decode CUDA graphs
    # Launch greedy decode step n + 1 before reading step n's tokens (engine/overlap.py). None = auto:
    # on where decode runs in CUDA graphs; elsewhere the host is not what a step waits for.
    async_scheduling: bool | None = None
    # Ranks (one process and one device each) that shard the model; see kvserve/distributed.
    tensor_parallel_size: int = 1
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 0
    # None: RAM prefix cache only (library and test default); `kvserve serve` turns it on.
    kv_store: KVStoreConfig | None = None

    @property
    def context_request(self) -> ContextRequest:
        """--ctx and the RoPE flags, as the model loader takes them."""
        return ContextRequest(self.max_model_len, self.rope_scaling, self.rope_scale, self.yarn_orig_ctx)

    @property
    def torch_dtype(self) -> torch.dtype:
        assert self.dtype != "auto", "call resolve() first"
        return _torch_dtype(self.dtype)

    @property
    def torch_kv_dtype(self) -> torch.dtype:
        assert self.cache.kv_dtype != "auto", "call resolve() first"
        return _torch_dtype(self.cache.kv_dtype)


def _torch_dtype(name: str) -> torch.dtype:
    import torch  # here, not at module level: the CLI builds its parsers from this module

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def cpu_has_fast_bf16() -> bool:
    """True with AMX or AVX512-BF16, where oneDNN's bf16 matmuls beat fp32; elsewhere bf16 is emulated."""
    from kvserve.models.layers import cpu_ext  # here: it reads the KVSERVE_* switches at import

    return cpu_ext.has_fast_bf16()


def resolve_weight_quant(config: EngineConfig, file_quant: WeightQuantName | None) -> EngineConfig:
    """--weight-quant auto, once the model is loaded (after resolve()): the low-bit copy that holds
    the model file's own layer weights (`LoadedModel.file_weight_quant`: int4 for a Q4 GGUF, int8
    for one of 5 to 8 bits), none for 16/32-bit weights. A quantized GGUF's weights already sit on
    that grid, so decode on them reads a quarter of fp32's bytes for the file's own precision, as
    llama.cpp does; users of a Q4 file expect its speed without a flag."""
    if config.weight_quant == "int4" and file_quant == "int8":
        # Measured (docs/numerics.md): on Gemma 3's Q4_K_M file, int4 decode is +10% perplexity and
        # int4 x int8 prefill +22%; the file's own pick (int8) is +0.1%.
        logger.warning(
            "--weight-quant int4 re-rounds this model file's 5-8-bit layers to 4 bits, which costs "
            "quality (docs/numerics.md); --weight-quant auto keeps the file's own precision (int8)"
        )
    if config.weight_quant != "auto":
        return config
    scheme = file_quant or "none"
    logger.info(
        "weight-quant auto -> %s (%s)",
        scheme,
        "the model file's layers are low-bit" if file_quant else "the model file's layers are 16/32-bit",
    )
    if config.int8_prefill and scheme != "int4":
        raise ValueError(f"--int8-prefill needs --weight-quant int4 (auto chose {scheme} for this model)")
    return dataclasses.replace(config, weight_quant=scheme)


def resolve(config: EngineConfig) -> EngineConfig:
    """Fill device and dtype; max_model_len is clamped later, once the model is known."""
    device = config.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, weight_quant = config.dtype, config.weight_quant
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") or cpu_has_fast_bf16() else "float32"
        if dtype == "bfloat16" and device == "cpu" and config.tensor_parallel_size == 1:
            # Low-bit decode is kvserve's C++ kernels, which take fp32 activations: ~2x torch's bf16
            # int4/int8 ops on an AVX512-BF16 EPYC (scripts/cpu_vs_llama_ab.py). So a CPU with fast
            # bf16 serving low-bit weights computes in fp32 and prefills on bf16 dense weights.
            scheme = _probe_file_weight_quant(config.model) if weight_quant == "auto" else weight_quant
            if scheme in ("int4", "int8"):
                dtype, weight_quant = "float32", scheme
                config = dataclasses.replace(
                    config, weight_quant=weight_quant, bf16_prefill=not config.int8_prefill
                )
        logger.info(
            "dtype auto -> %s (device %s%s)",
            dtype,
            device,
            "; bf16 dense weights for prefill, low-bit decode" if config.bf16_prefill else "",
        )
    if weight_quant == "auto" and (
        device != "cpu" or dtype not in ("bfloat16", "float32") or config.tensor_parallel_size > 1
    ):
        weight_quant = "none"  # low-bit copies serve CPU decode only; the rest waits for the model
        config = dataclasses.replace(config, weight_quant=weight_quant)
    if weight_quant not in ("none", "auto") and (device != "cpu" or dtype not in ("bfloat16", "float32")):
        raise ValueError("--weight-quant needs --device cpu and --dtype bfloat16 or float32")
    if config.int8_prefill and (weight_quant not in ("int4", "auto") or dtype != "float32"):
        raise ValueError("--int8-prefill needs --weight-quant int4 and --dtype float32")
    if config.bf16_prefill and (weight_quant == "none" or dtype != "float32" or config.int8_prefill):
        raise ValueError(
            "--bf16-prefill needs --weight-quant int4/int8/auto and --dtype float32, without --int8-prefill"
        )
    if config.tensor_parallel_size < 1:
        raise ValueError("--tensor-parallel-size must be >= 1")
    if config.tensor_parallel_size > 1 and weight_quant != "none":
        raise ValueError("--weight-quant does not combine with --tensor-parallel-size > 1")
    if not 0.0 < config.cache.gpu_memory_utilization <= 1.0:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    config = dataclasses.replace(
        config,
        scheduler=_scheduler_defaults(config.scheduler, device),
        cache=dataclasses.replace(config.cache, kv_dtype=_kv_dtype(config.cache.kv_dtype, dtype, device)),
    )
    if config.scheduler.max_num_batched_tokens < config.scheduler.max_num_seqs:
        # Otherwise the last running sequences would get no decode slot in a step.
        raise ValueError("--max-num-batched-tokens must be >= --max-num-seqs")
    return dataclasses.replace(config, device=device, dtype=dtype)


def _kv_dtype(requested: str, dtype: str, device: str) -> str:
    """The KV pool's dtype: the engine's own, or float16 under a float32 engine on CPU (where the
    attention paths widen it: csrc/decode_attention.cpp, attention/torch_ref.py)."""
    on_cpu = device == "cpu"
    if requested == "auto":
        return "float16" if on_cpu and dtype == "float32" else dtype
    if requested not in KV_DTYPE_CHOICES:
        raise ValueError(f"unknown --kv-cache-dtype {requested!r} (one of {', '.join(KV_DTYPE_CHOICES)})")
    if requested != dtype and not (on_cpu and dtype == "float32" and requested == "float16"):
        raise ValueError(
            f"--kv-cache-dtype {requested} does not combine with --dtype {dtype} on {device}: the KV "
            "is the engine's own dtype, or float16 under a float32 engine on CPU"
        )
    return requested


def _probe_file_weight_quant(model: str) -> str | None:
    """What `--weight-quant auto` will pick for `model` (its GGUF header's layer types), before
    loading it; None for a 16/32-bit file, an HF folder or a path the loader will reject itself."""
    from kvserve.models.loader.gguf import file_weight_quant
    from kvserve.models.loader.gguf_reader import read_gguf
    from kvserve.models.loader.paths import resolve_model_path

    try:
        path = resolve_model_path(model)
        return None if path.is_dir() else file_weight_quant(read_gguf(path))
    except Exception:  # noqa: BLE001 - the loader reports a bad model path with its own message
        return None


def _scheduler_defaults(scheduler: SchedulerConfig, device: str) -> SchedulerConfig:
    """Fill 0 (auto) fields with the device's defaults; an auto token budget is at least the batch.
    A budget given by hand holds for every step; an automatic one on CPU is smaller while sequences
    decode."""
    seqs, tokens, with_decodes = DEVICE_SCHEDULER_DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
    max_num_seqs = scheduler.max_num_seqs or seqs
    if scheduler.max_num_batched_tokens:
        max_num_batched_tokens = scheduler.max_num_batched_tokens
        budget_with_decodes = scheduler.budget_with_decodes
    else:
        max_num_batched_tokens = max(tokens, max_num_seqs)
        budget_with_decodes = min(max(with_decodes, max_num_seqs), max_num_batched_tokens)
    resolved = SchedulerConfig(
        max_num_seqs,
        max_num_batched_tokens,
        0 if budget_with_decodes == max_num_batched_tokens else budget_with_decodes,
    )
    if resolved != scheduler:
        logger.info(
            "scheduler auto -> --max-num-seqs %d --max-num-batched-tokens %d%s (device %s)",
            max_num_seqs,
            max_num_batched_tokens,
            f" ({budget_with_decodes} while sequences decode)" if resolved.max_tokens_with_decodes else "",
            device,
        )
    return resolved
