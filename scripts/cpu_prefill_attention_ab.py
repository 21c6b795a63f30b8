"""One layer's prompt attention on the CPU: torch's SDPA (the folded-heads path of
attention/torch_ref.py, under its explicit mask, after the gather of the paged KV) against the C++
kernel (csrc/prefill_attention.cpp) at several (query tile, key block) sizes, SmolLM2-135M's heads
(9 query heads over 3 KV heads of 64), fp16 paged KV, a 512-row chunk after 0, 6,000 and 12,000
cached tokens. `gemms` times the two matmuls alone over all keys, unmasked, as torch.bmm runs them.

    python3 scripts/cpu_prefill_attention_ab.py --threads 2 --dtype bfloat16   # AMX/AVX512-BF16: VNNI
    python3 scripts/cpu_prefill_attention_ab.py --threads 2 --dtype float32
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention.cpu_prefill import CpuPrefillKernel

KV_HEADS, GROUP, DIM, BLOCK_SIZE = 3, 3, 64, 16


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--contexts", default="0,6000,12000")
    parser.add_argument("--tiles", default="32x128,64x128,64x256,128x256,64x512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    ext = cpu_ext.load()
    assert ext is not None, "the CPU kernels do not build here"
    vnni = dtype == torch.bfloat16 and CpuPrefillKernel.for_dtype(dtype) is not None
    tiles = [tuple(int(x) for x in tile.split("x")) for tile in args.tiles.split(",")]
    rows = args.rows
    print(f"{args.dtype}, {args.threads} threads, {rows} rows, VNNI layout: {vnni}")
    for context in (int(c) for c in args.contexts.split(",")):
        best, diff = _measure(ext, context, rows, dtype, vnni, tiles, args.repeats)
        print(
            f"context {context}: max |kernel - sdpa| {diff:.1e}; "
            + ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in best.items())
        )


def _measure(
    ext: Any,
    context: int,
    rows: int,
    dtype: torch.dtype,
    vnni: bool,
    tiles: list[tuple[int, int]],
    repeats: int,
) -> tuple[dict[str, float], float]:
    """Best seconds per configuration, and the largest difference of the first tile size from SDPA."""
    seq_len = context + rows
    num_blocks = -(-seq_len // BLOCK_SIZE)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, KV_HEADS, DIM).to(torch.float16)
    table = torch.arange(num_blocks)
    q = torch.randn(KV_HEADS, GROUP, rows, DIM).to(dtype)
    query_pos, key_pos = torch.arange(context, seq_len)[:, None], torch.arange(seq_len)[None]
    mask = torch.zeros(rows, seq_len, dtype=dtype).masked_fill_(key_pos > query_pos, float("-inf"))
    mask = mask.repeat(GROUP, 1)
    keys = torch.randn(KV_HEADS, seq_len, DIM).to(dtype)
    probs = torch.randn(KV_HEADS, GROUP * rows, seq_len).to(dtype)

    def sdpa() -> torch.Tensor:
        kv = cache.index_select(1, table).flatten(1, 2)[:, :seq_len].transpose(1, 2).to(dtype)
        q_rows = q.reshape(1, KV_HEADS, GROUP * rows, DIM)
        return F.scaled_dot_product_attention(
            q_rows, kv[0][None], kv[1][None], attn_mask=mask, scale=DIM**-0.5
        )

    def gemms() -> None:
        torch.bmm(q.reshape(KV_HEADS, GROUP * rows, DIM), keys.transpose(1, 2))
        torch.bmm(probs, keys)

    def kernel(tile: int, block: int) -> torch.Tensor:
        return ext.prefill_attention(q, cache, table, context, DIM**-0.5, 0, vnni, tile, block)

    runs: dict[str, Callable[[], object]] = {"sdpa": sdpa, "gemms": gemms}
    for tile, block in tiles:
        runs[f"kernel {tile}x{block}"] = functools.partial(kernel, tile, block)
    reference = sdpa()[0].view(KV_HEADS, GROUP, rows, DIM).float()
    diff = float((kernel(*tiles[0]) - reference).abs().max())
    best = {}
    for name, run in runs.items():
        run()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        best[name] = min(times)
    return best, diff


if __name__ == "__main__":
    main()
