"""A dense CPU engine's decode rows (--weight-quant none, quant.decode_rows): what a step of SmolLM2's
shapes costs by rows per call, and whether calls of a fixed size give every row the bits it gets
alone in such a call, wherever it sits.

A decode step reads every weight once from DRAM, so a call of a few rows costs little more than
one; torch's CPU GEMMs pick their kernel by row count, so only calls of one size promise a row's
bits (docs/numerics.md). Per dtype: the median ms of a step (30 layers' q/k/v, o, gate/up and down
projections, each layer's own weights, and the LM head) for one call of 1, 2, 4, 8 and 16 rows,
and for each fixed call size the rows (of 1 to 2 blocks, at offsets 0 and 3) whose bits differ.

    .venv/bin/python scripts/dense_decode_rows.py --threads 2 --json rows.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# SmolLM2-135M: hidden 576, 9 query and 3 KV heads of 64, MLP 1536, vocab 49152.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
VOCAB = 49152
ROWS = (1, 2, 4, 8, 16)


def step_ms(weights: list[torch.Tensor], rows: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        xs = [torch.randn(rows, w.shape[1]).to(w.dtype) for w in weights]
        start = time.perf_counter()
        for w, x in zip(weights, xs, strict=True):
            F.linear(x, w)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def fixed_calls(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """Rows in calls of exactly `block` (the last padded), as quant._dense_rows does."""
    rows = x.shape[0]
    padded = torch.cat([x, x.new_zeros(-rows % block, x.shape[1])])
    return torch.cat([F.linear(part, w) for part in padded.split(block)])[:rows]


def differing_rows(w: torch.Tensor, block: int, gen: torch.Generator) -> list[list[int]]:
    x = torch.randn(3 * block + 3, w.shape[1], generator=gen).to(w.dtype)
    full = fixed_calls(x, w, block)
    return [
        [rows, start]
        for rows in range(1, 2 * block + 1)
        for start in (0, 3)
        if not torch.equal(fixed_calls(x[start : start + rows], w, block), full[start : start + rows])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    report: dict = {"threads": args.threads, "torch": torch.__version__}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        weights = [torch.randn(o, i, generator=gen).to(dtype) for _ in range(30) for o, i in SHAPES]
        weights.append(torch.randn(VOCAB, 576, generator=gen).to(dtype))
        ms = {rows: step_ms(weights, rows, args.repeats) for rows in ROWS}
        differ = {
            block: {f"{o}x{i}": differing_rows(weights[k], block, gen) for k, (o, i) in enumerate(SHAPES)}
            for block in (4, 8, 16)
        }
        report[name] = {"step_ms_by_rows": ms, "fixed_calls_rows_that_differ": differ}
        print(name, "ms a step:", "  ".join(f"{r} rows {t:.1f}" for r, t in ms.items()))
        for block, shapes in differ.items():
            print(f"  {block}-row calls, (rows, offset) that differ:", {s: d[:4] for s, d in shapes.items()})
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
