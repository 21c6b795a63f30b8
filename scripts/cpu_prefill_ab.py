"""A long prompt's CPU prefill, one layer of SmolLM2-135M's shapes at a time, in the engine's 512-token
chunks: the attention through kvserve's torch backend (paged KV in fp16, as the CPU default) and the
layer's GEMMs, in four configurations, interleaved in one process:

- `fp32-before`: the attention as it was (KV heads repeated for each query head), fp32 GEMMs: the
  default on an AVX2-only CPU before;
- `fp32`: fp32 attention with grouped heads folded into the queries (no KV copy): that default now;
- `bf16w-before`: the attention as it was in fp32, bf16 GEMMs: what `--dtype auto` ran on an
  AVX512-BF16/AMX CPU (--bf16-prefill's weights, fp32 attention);
- `bf16`: the folded attention in bf16 and bf16 GEMMs: --bf16-prefill now.

Reports seconds per configuration for the whole prompt (a layer's time x the model's 30 layers; the
embedding, norms, RoPE and LM head are left out), split into attention and GEMMs.

    .venv/bin/python scripts/cpu_prefill_ab.py --tokens 12500 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvserve.models.layers.attention.kv_dtype import to_kv_dtype
from kvserve.models.layers.attention.metadata import AttentionMetadata
from kvserve.models.layers.attention.torch_ref import TorchRefBackend

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, LAYERS = 9, 3, 64, 576, 1536, 30
BLOCK = 16


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=12500)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--configs",
        default="all",
        help="comma-separated, e.g. fp32-before,fp32 (bf16 is slow without AVX512-BF16)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    n = args.tokens
    blocks = -(-n // BLOCK)
    cache = to_kv_dtype(torch.randn(2, blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen), torch.float16)
    table = torch.arange(blocks)[None, :]
    weights = {
        name: torch.randn(shape, generator=gen) * 0.02
        for name, shape in {
            "qkv": (HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
            "o": (HIDDEN, HIDDEN),
            "gate_up": (2 * FFN, HIDDEN),
            "down": (HIDDEN, FFN),
        }.items()
    }
    bf16_weights = {name: w.to(torch.bfloat16) for name, w in weights.items()}
    configs = {
        "fp32-before": (_attend_before, weights),
        "fp32": (TorchRefBackend(), weights),
        "bf16w-before": (_attend_before, bf16_weights),
        "bf16": (TorchRefBackend(prefill_dtype=torch.bfloat16), bf16_weights),
    }
    if args.configs != "all":
        configs = {name: configs[name] for name in args.configs.split(",")}
    baseline = {
        "fp32-before": "fp32-before",
        "fp32": "fp32-before",
        "bf16w-before": "bf16w-before",
        "bf16": "bf16w-before",
    }
    totals = {name: {"attention": 0.0, "gemm": 0.0} for name in configs}
    starts = list(range(0, n, args.chunk))
    for _ in range(args.repeats):
        for start in starts:
            size = min(args.chunk, n - start)
            q = torch.randn(size, HEADS, HEAD_DIM, generator=gen)
            k = torch.randn(size, KV_HEADS, HEAD_DIM, generator=gen)
            x = torch.randn(size, HIDDEN, generator=gen)
            metadata = _metadata(start, size, table)
            # What a forward builds once for all its layers (the plan and its mask) is built untimed.
            visible = torch.arange(0, start + size)[None, :] <= torch.arange(start, start + size)[:, None]
            for name, (attend, layer_weights) in configs.items():  # interleaved: same machine state
                if isinstance(attend, TorchRefBackend):
                    attend.attend(q, k, k, cache, metadata, scale=HEAD_DIM**-0.5)
                t0 = time.perf_counter()
                if isinstance(attend, TorchRefBackend):
                    attend.attend(q, k, k, cache, metadata, scale=HEAD_DIM**-0.5)
                else:
                    attend(q, k, cache, metadata, visible)
                t1 = time.perf_counter()
                _gemms(x, layer_weights)
                t2 = time.perf_counter()
                totals[name]["attention"] += (t1 - t0) / args.repeats
                totals[name]["gemm"] += (t2 - t1) / args.repeats
    flags = _cpu_flags()
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} threads, "
        f"CPU flags: {' '.join(flags) or 'no avx512/amx'}; {n} tokens in {len(starts)} chunks of {args.chunk}"
    )
    rows = {}
    for name, t in totals.items():
        before = sum(totals[baseline[name]].values()) if baseline[name] in totals else float("nan")
        whole = (t["attention"] + t["gemm"]) * LAYERS
        rows[name] = {
            "prefill_s": round(whole, 2),
            "attention_s": round(t["attention"] * LAYERS, 2),
            "gemm_s": round(t["gemm"] * LAYERS, 2),
            "tok_per_s": round(n / whole, 1),
            "speedup": round(before * LAYERS / whole, 2),
            "vs": baseline[name],
        }
        print(
            f"{name:>12}: {whole:7.2f} s ({n / whole:6.1f} tok/s), attention {t['attention'] * LAYERS:6.2f} s, "
            f"GEMMs {t['gemm'] * LAYERS:6.2f} s, {before * LAYERS / whole:.2f}x {baseline[name]}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "cpu_flags": flags,
                    "torch": torch.__version__,
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )


def _metadata(start: int, size: int, table: torch.Tensor) -> AttentionMetadata:
    end = start + size
    slots = torch.arange(start, end)
    return AttentionMetadata(
        block_size=BLOCK,
        num_decodes=0,
        slot_mapping=slots,
        block_tables=table[:, : -(-end // BLOCK)],
        seq_lens=torch.tensor([end]),
        query_start_loc_cpu=[0, size],
        seq_lens_cpu=[end],
        context_lens_cpu=[start],
        computes_prompt=True,
    )


def _attend_before(
    q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, metadata: AttentionMetadata, visible: torch.Tensor
) -> torch.Tensor:
    """The prefill attention before grouped heads were folded (torch_ref.py at 39be48f)."""
    end = metadata.seq_lens_cpu[0]
    blocks = metadata.block_tables[0]
    kv = cache.index_select(1, blocks).flatten(1, 2)[:, :end].transpose(1, 2).to(q.dtype)
    k_seq, v_seq = (
        kv[0].repeat_interleave(HEADS // KV_HEADS, 0),
        kv[1].repeat_interleave(HEADS // KV_HEADS, 0),
    )
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_seq[None], v_seq[None], attn_mask=visible, scale=HEAD_DIM**-0.5
    )[0]
    return out.transpose(0, 1)


def _gemms(x: torch.Tensor, weights: dict[str, torch.Tensor]) -> None:
    x = x.to(weights["qkv"].dtype)
    F.linear(x, weights["qkv"])
    F.linear(x, weights["o"])
    F.linear(F.linear(x, weights["gate_up"])[:, :FFN], weights["down"])


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return sorted(f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512f", "avx512_vnni")))


if __name__ == "__main__":
    main()
