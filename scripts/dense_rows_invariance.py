"""Which rows of a CPU prompt GEMM change with the number of rows that come with them (issue 35).

kvserve's prompt steps run the decoder's dense weights through `quant._dense_rows`; a request's answer
must not depend on what shares its step, so each output row must have the same bits whatever the
batch. On an AVX2 CPU torch's fp32 GEMM changes kernel below 16 rows (padding fixes that); on an
Intel Xeon with AMX a bf16 test failed with padding to 16. This script finds out where on the CPU
it runs: for SmolLM2's projection shapes and each padding strategy, the batch sizes whose rows differ
from the same rows computed inside a large batch, and what each strategy costs on prompt-sized
batches.

    python3 scripts/dense_rows_invariance.py --threads 2 --json OUT/dense-rows.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = ((1536, 576), (576, 1536), (576, 576), (192, 576))  # SmolLM2's up/gate, down, q/o, k/v
SIZES = (*range(1, 82), 96, 127, 128, 200, 255, 256, 300, 511, 512)
REFERENCE_ROWS = 1024


def plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.to(w.dtype), w).float()


def pad_to(multiple: int, minimum: int = 0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        target = max(minimum, -(-rows // multiple) * multiple)
        if target != rows:
            x = torch.cat([x, x.new_zeros(target - rows, x.shape[1])])
        return F.linear(x.to(w.dtype), w).float()[:rows]

    return run


def blocks_of(block: int, packed: bool = False) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Every row inside a call of exactly `block` rows (the last one padded); `packed`: the weight
    reordered once into oneDNN's layout (bf16 only), as kvserve's `quant.pack_dense_weight` does."""
    pad = pad_to(block)
    cache: dict[int, torch.Tensor] = {}

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not packed or w.dtype != torch.bfloat16:
            return torch.cat([pad(part, w) for part in x.split(block)])
        if id(w) not in cache:
            cache.clear()
            cache[id(w)] = torch.ops.mkldnn._reorder_linear_weight(w, block)
        rows = x.shape[0]
        x = x.to(w.dtype)
        if rows % block:
            x = torch.cat([x, x.new_zeros(block - rows % block, x.shape[1])])
        parts = [
            torch.ops.mkldnn._linear_pointwise(b, cache[id(w)], None, "none", [], "") for b in x.split(block)
        ]
        return torch.cat(parts).float()[:rows]

    return run


STRATEGIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "plain": plain,
    "pad16-min (today)": pad_to(1, 16),
    "pad-multiple-16": pad_to(16),
    "pad-multiple-32": pad_to(32),
    "pad-multiple-64": pad_to(64),
    "blocks-64": blocks_of(64),
    "blocks-128": blocks_of(128),
    "blocks-32": blocks_of(32),
    "blocks-32-packed": blocks_of(32, packed=True),
    "blocks-64-packed": blocks_of(64, packed=True),
    "blocks-128-packed": blocks_of(128, packed=True),
}


def check(dtype: torch.dtype, name: str) -> dict:
    run = STRATEGIES[name]
    gen = torch.Generator().manual_seed(0)
    result = {}
    for out_f, in_f in SHAPES:
        w = (torch.randn(out_f, in_f, generator=gen) * 0.05).to(dtype)
        x = torch.randn(REFERENCE_ROWS, in_f, generator=gen)
        full = run(x, w)
        bad = []
        if not torch.equal(run(x, w), full):  # the same call twice: a reduction split across threads
            bad.append({"rows": REFERENCE_ROWS, "start": 0, "differing_rows": ["not deterministic"]})
        for rows in SIZES:
            # The same rows at another offset, too: row i's bits must not depend on its neighbours.
            for start in (0, 7):
                got = run(x[start : start + rows], w)
                again = run(x[start : start + rows], w)
                if not torch.equal(got, again):
                    bad.append({"rows": rows, "start": start, "differing_rows": ["not deterministic"]})
                if not torch.equal(got, full[start : start + rows]):
                    differing = (got != full[start : start + rows]).any(dim=1).nonzero().flatten()
                    bad.append({"rows": rows, "start": start, "differing_rows": differing[:8].tolist()})
        result[f"{out_f}x{in_f}"] = bad
    return result


def cost(dtype: torch.dtype, name: str) -> dict:
    run = STRATEGIES[name]
    out = {}
    for rows in (17, 100, 512, 2048):
        w = torch.randn(1536, 576).to(dtype)
        x = torch.randn(rows, 576)
        for _ in range(3):
            run(x, w)
        reps = 20
        started = time.perf_counter()
        for _ in range(reps):
            run(x, w)
        out[str(rows)] = (time.perf_counter() - started) / reps * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    report = {
        "cpu": platform.processor() or platform.machine(),
        "isa": sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512f"))),
        "torch": torch.__version__,
        "threads": args.threads,
        "results": {},
    }
    for dtype in (getattr(torch, name) for name in args.dtypes):
        for name in args.strategies:
            bad = check(dtype, name)
            ms = cost(dtype, name)
            key = f"{str(dtype).removeprefix('torch.')} {name}"
            report["results"][key] = {"mismatches": bad, "ms_1536x576": ms}
            count = sum(len(v) for v in bad.values())
            sizes = sorted({b["rows"] for v in bad.values() for b in v})[:16]
            print(f"{key:32s} mismatching cases {count:4d} sizes {sizes}  ms {ms}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
