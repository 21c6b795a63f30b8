"""Engine flags shared by every subcommand that runs a model, mapped onto EngineConfig.

Building the flags imports no torch and no engine (`kvserve --help` stays fast): `build_engine`
(`engine/build.py`) imports them when a command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kvserve.config import (
    KV_DTYPE_CHOICES,
    CacheConfig,
    EngineConfig,
    KVStoreConfig,
    SchedulerConfig,
    SharedKVConfig,
)
from kvserve.kvstore.cache_dir import default_cache_dir

logger = logging.getLogger(__name__)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model", "-m", default=d.model, help="GGUF file, HF folder or alias (see `kvserve models`)"
    )
    g.add_argument(
        "--mmproj",
        default=d.mmproj,
        metavar="FILE",
        help="a GGUF model's vision projector (llama.cpp's mmproj file: SmolVLM's, Qwen2.5-VL's); default "
        "auto: the one mmproj*.gguf beside the model file; none: text only",
    )
    g.add_argument("--no-mmproj", action="store_true", help="load no vision projector (--mmproj none)")
    g.add_argument(
        "--dtype",
        default=d.dtype,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="compute dtype; auto = bf16 on CUDA and CPUs with AMX/AVX512-BF16, else fp32",
    )
    g.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto")
    g.add_argument(
        "--weight-quant",
        default="auto",
        choices=["auto", "none", "int8", "int4"],
        help="CPU only: low-bit weight copies for decode-sized batches (faster; lossy for 16/32-bit "
        "weights); auto = the precision of a quantized GGUF's own layers (int4 for Q4, int8 for Q5-Q8), "
        "none for 16/32-bit weights and on CUDA",
    )
    g.add_argument(
        "--int8-prefill",
        action="store_true",
        default=d.int8_prefill,
        help="fp32 --weight-quant int4: prefill on the int4 weights with int8-rounded activations too "
        "(faster prefill on AVX2; lossier: it changed SmolLM2's greedy answers)",
    )
    g.add_argument(
        "--bf16-prefill",
        action="store_true",
        default=d.bf16_prefill,
        help="fp32 --weight-quant int4/int8: keep the dense weights that prefill uses in bf16 (fast on "
        "AVX512-BF16/AMX CPUs, where --dtype auto turns it on)",
    )
    g.add_argument(
        "--ctx",
        type=int,
        default=d.max_model_len,
        help="context length (0 = the model's); above the trained context, RoPE is extended with YaRN",
    )
    g.add_argument(
        "--rope-scaling",
        default=d.rope_scaling,
        choices=["none", "linear", "yarn"],
        help="RoPE context extension (default: the model's own; yarn when --ctx exceeds the trained "
        "context); none refuses a --ctx above it",
    )
    g.add_argument(
        "--rope-scale",
        type=float,
        default=d.rope_scale,
        metavar="F",
        help="RoPE scaling factor: the context grows F times (default: --ctx / the original context)",
    )
    g.add_argument(
        "--yarn-orig-ctx",
        type=int,
        default=d.yarn_orig_ctx,
        metavar="N",
        help="YaRN: the context the model was trained at (default: from the model file)",
    )
    g.add_argument(
        "--max-num-seqs",
        type=int,
        default=0,
        help="sequences decoded together (continuous batching; default 16 on CPU, 256 on CUDA)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=0,
        help="token budget of one step (prefill chunk size; default on CPU 2048 with nothing decoding, "
        "512 while sequences decode; 8192 on CUDA); a value given holds for every step",
    )
    g.add_argument("--block-size", type=int, default=d.cache.block_size, help="tokens per KV block")
    g.add_argument(
        "--kv-cache-memory-mb", type=int, default=d.cache.kv_cache_memory_mb, help="KV pool size (0 = auto)"
    )
    g.add_argument(
        "--encoder-cache-mb",
        type=int,
        default=d.cache.encoder_cache_mb,
        help="device memory for vision-encoder outputs kept by image, so a resent image is not "
        "encoded again (image models only)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=KV_DTYPE_CHOICES,
        default=d.cache.kv_dtype,
        help="the KV's dtype, in the pool and on disk (auto: float16 for a float32 engine on CPU, "
        "as llama.cpp's default; else the engine's dtype)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.cache.gpu_memory_utilization,
        help="CUDA: share of GPU memory for weights, activations, CUDA graphs and the KV pool",
    )
    g.add_argument(
        "--attention-backend",
        default=d.attention_backend,
        choices=["auto", "torch_ref", "triton"],
        help="paged attention kernels; auto = triton on CUDA, torch_ref on CPU",
    )
    g.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    g.add_argument(
        "--async-scheduling",
        choices=["auto", "on", "off"],
        default="auto",
        help="launch greedy decode step n+1 before reading step n's tokens; auto = on with CUDA graphs",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=d.tensor_parallel_size,
        help="shard the model over N processes, one GPU each (NCCL; on CPU: gloo, for testing)",
    )
    g.add_argument("--seed", type=int, default=d.seed, help="global RNG seed for unseeded requests")


def add_kv_store_args(parser: argparse.ArgumentParser) -> None:
    """The disk KV tier's flags, for the commands that serve (a one-shot `generate` has no use for it)."""
    g = parser.add_argument_group("disk KV cache")
    g.add_argument(
        "--kv-cache-dir",
        default=None,
        help=f"where KV checkpoints live (default {default_cache_dir()}; created 0700)",
    )
    g.add_argument(
        "--kv-cache-budget-mb",
        type=int,
        default=4096,
        help="disk budget of the KV checkpoints; the lowest-scoring ones are evicted",
    )
    g.add_argument(
        "--no-kv-cache-preload",
        action="store_true",
        help="do not read the most recently used checkpoints into RAM at start-up (up to half the pool)",
    )
    g.add_argument("--no-kv-cache", action="store_true", help="no disk KV tier (RAM prefix cache only)")
    add_shared_kv_args(g)


def add_shared_kv_args(group: argparse._ActionsContainer) -> None:
    """Where the KV tier shared by replicas lives (`kvserve serve` and `kvserve kv`)."""
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--kv-shared-dir",
        metavar="PATH",
        default=None,
        help="a KV tier shared with other replicas: a directory they all mount (NFS); below the disk tier",
    )
    where.add_argument(
        "--kv-s3-url",
        metavar="s3://BUCKET[/PREFIX]",
        default=None,
        help="a KV tier shared with other replicas in an S3 bucket (credentials from the AWS_* variables)",
    )
    group.add_argument(
        "--kv-s3-endpoint",
        metavar="URL",
        default=None,
        help="an S3-compatible server (SeaweedFS, MinIO); default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS",
    )


def shared_kv_location(args: argparse.Namespace) -> str | None:
    """The shared tier the flags name (a directory or an s3:// URL), or None."""
    shared_dir, s3_url = getattr(args, "kv_shared_dir", None), getattr(args, "kv_s3_url", None)
    if s3_url is not None and not s3_url.startswith("s3://"):
        sys.exit(f"kvserve: --kv-s3-url must look like s3://bucket/prefix, not {s3_url!r}")
    if getattr(args, "kv_s3_endpoint", None) and s3_url is None:
        sys.exit("kvserve: --kv-s3-endpoint needs --kv-s3-url")
    return shared_dir or s3_url


def kv_store_config_from_args(args: argparse.Namespace) -> KVStoreConfig | None:
    shared = shared_kv_location(args)
    if getattr(args, "no_kv_cache", True):  # also: a command without the flags
        if shared is not None:
            sys.exit(
                "kvserve: a shared KV tier (--kv-shared-dir, --kv-s3-url) needs the disk tier: drop --no-kv-cache"
            )
        return None
    if args.kv_cache_budget_mb < 1:
        sys.exit("kvserve: --kv-cache-budget-mb must be >= 1")
    directory = args.kv_cache_dir or str(default_cache_dir())
    if shared is not None and not shared.startswith("s3://") and _same_dir(shared, directory):
        # The local tier evicts and repairs its directory as its own: it would delete shared objects.
        sys.exit("kvserve: --kv-shared-dir must not be the --kv-cache-dir (each replica keeps its own)")
    return KVStoreConfig(
        directory=directory,
        budget_mb=args.kv_cache_budget_mb,
        preload_fraction=0.0 if args.no_kv_cache_preload else KVStoreConfig.preload_fraction,
        shared=None if shared is None else SharedKVConfig(shared, args.kv_s3_endpoint),
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        mmproj="none" if args.no_mmproj else args.mmproj,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.ctx,
        rope_scaling=args.rope_scaling,
        rope_scale=args.rope_scale,
        yarn_orig_ctx=args.yarn_orig_ctx,
        weight_quant=args.weight_quant,
        int8_prefill=args.int8_prefill,
        bf16_prefill=args.bf16_prefill,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
        tensor_parallel_size=args.tensor_parallel_size,
        cache=CacheConfig(
            block_size=args.block_size,
            kv_cache_memory_mb=args.kv_cache_memory_mb,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_dtype=args.kv_cache_dtype,
            encoder_cache_mb=args.encoder_cache_mb,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        ),
        seed=args.seed,
        kv_store=kv_store_config_from_args(args),
    )


def _same_dir(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
