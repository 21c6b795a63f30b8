"""`kvserve bench engine`: engine throughput beside llama.cpp on the same GGUF; the HTTP benchmarks
(`serve`, `multiturn`, `context`, `compare`) are registered from `bench_serving.py`, `quality` from
`bench_quality.py`."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from kvserve.bench.shape_configs import SHAPES
from kvserve.cli import bench_cluster, bench_hostile, bench_quality, bench_serving, bench_soak
from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
from kvserve.engine.build import build_engine


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bench_sub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    e = bench_sub.add_parser(
        "engine", help="offline prefill/decode throughput vs llama.cpp (CPU) or transformers (--shape)"
    )
    e.add_argument(
        "--prefill-lens", default=None, help="comma-separated prompt lengths (512,2048; --shape: 512,8192)"
    )
    e.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated stream counts for decode (1,4,16; --shape: 1,16,64,256)",
    )
    e.add_argument("--decode-tokens", type=int, default=128)
    e.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="random-weight model of this shape (no download); the peer is HF transformers eager",
    )
    e.add_argument("--peer-decode-tokens", type=int, default=32, help="--shape: new tokens per HF run")
    e.add_argument("--repeats", type=int, default=3, help="best of N runs for every figure")
    e.add_argument(
        "--no-peer", action="store_true", help="skip the peer (llama.cpp; with --shape, HF transformers)"
    )
    # default None: torch's own thread count, read when the command runs (no torch in the parser)
    e.add_argument("--threads", type=int, default=None, help="threads for both engines")
    e.add_argument("--json", type=Path, default=None, help="also write the results here")
    add_engine_args(e)
    e.set_defaults(func=run_engine, max_num_batched_tokens=2048)
    bench_serving.register(bench_sub)  # serve | multiturn | context | compare (HTTP benchmarks)
    bench_quality.register(bench_sub)  # quality: perplexity and KL divergence of the fast paths
    bench_soak.register(bench_sub)  # soak: disconnecting clients over time, the server's state after
    bench_hostile.register(bench_sub)  # hostile: slowloris, slow readers, oversized and broken bodies
    bench_cluster.register(bench_sub)  # cluster: kvserve cluster's router against Ray's default


def run_engine(args: argparse.Namespace) -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    from kvserve.bench.engine_bench import bench_kvserve, bench_llama_cpp

    if args.threads is None:
        args.threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    if args.shape is not None:
        from kvserve.cli.bench_shape import run_engine_shape

        run_engine_shape(args)
        return
    prefill_lens = [int(x) for x in (args.prefill_lens or "512,2048").split(",")]
    concurrency = [int(x) for x in (args.concurrency or "1,4,16").split(",")]
    engine = build_engine(engine_config_from_args(args))
    ours = bench_kvserve(engine, prefill_lens, concurrency, args.decode_tokens, args.repeats)
    peer = None
    if not args.no_peer:
        if engine.loaded.path.suffix != ".gguf":
            peer = "llama.cpp needs a GGUF model"
        else:
            vocab = engine.loaded.arch.vocab_size
            peer = bench_llama_cpp(
                str(engine.loaded.path), vocab, prefill_lens, args.decode_tokens, args.repeats, args.threads
            )
    table = Table("metric", "kvserve", "llama.cpp", "ratio", title=f"kvserve bench engine ({args.model})")
    for n, ours_v in ours.prefill_tok_s.items():
        _row(table, f"prefill {n} tok (tok/s)", ours_v, peer, "prefill_tok_s", n)
    for c, ours_v in ours.decode_tok_s.items():
        _row(table, f"decode x{c} (tok/s)", ours_v, peer, "decode_tok_s", min(c, 1))
    console = Console()
    console.print(table)
    if isinstance(peer, str):
        console.print(f"[yellow]peer skipped: {peer}[/]")
    console.print("ratios for x4/x16 are against llama.cpp's single stream")
    report = {
        "model": args.model,
        "dtype": engine.config.dtype,
        "weight_quant": engine.config.weight_quant,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "kvserve": ours.to_json(),
        "llama_cpp": peer.to_json() if peer is not None and not isinstance(peer, str) else peer,
    }
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _row(table, label: str, ours: float, peer, attr: str, key: int) -> None:
    theirs = getattr(peer, attr).get(key) if peer is not None and not isinstance(peer, str) else None
    ratio = f"{ours / theirs:.2f}x" if theirs else "-"
    table.add_row(label, f"{ours:.1f}", f"{theirs:.1f}" if theirs else "-", ratio)
