"""`kvserve bench engine --shape NAME --device cuda`: random weights, HF transformers as the peer."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import json
import sys

import torch

from kvserve.cli.engine_args import engine_config_from_args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def run_engine_shape(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvserve.bench.engine_bench import bench_kvserve
    from kvserve.bench.gpu_bench import bench_hf, gpu_info, measure_copy_roofline
    from kvserve.bench.shapes import build_hf_model, random_loaded_model, weight_bytes
    from kvserve.config import SchedulerConfig, resolve
    from kvserve.engine.core import EngineCore

    if not torch.cuda.is_available() or not args.device.startswith(("cuda", "auto")):
        sys.exit("kvserve: bench engine --shape needs a CUDA device (--device cuda)")
    prefill_lens = _ints(args.prefill_lens or "512,8192")
    concurrency = _ints(args.concurrency or "1,16,64,256")
    config = engine_config_from_args(args)
    config = resolve(
        dataclasses.replace(
            config,
            model=args.shape,
            device="cuda" if args.device == "auto" else args.device,
            dtype="bfloat16" if args.dtype == "auto" else args.dtype,
            scheduler=SchedulerConfig(
                max_num_seqs=max(args.max_num_seqs, max(concurrency)),
                max_num_batched_tokens=max(args.max_num_batched_tokens, max(prefill_lens)),
            ),
        )
    )
    torch.manual_seed(config.seed)
    tp = config.tensor_parallel_size
    hf = build_hf_model(args.shape, config.torch_dtype, config.device, seed=config.seed)
    # Per GPU: each rank streams its shard of the weights (the all-reduces are not in the roofline).
    roofline = measure_copy_roofline(weight_bytes(hf) // tp)
    peer = None
    if not args.no_peer:  # transformers on one GPU, at every TP size
        vocab = hf.config.vocab_size
        peer = bench_hf(hf, vocab, prefill_lens, concurrency, args.peer_decode_tokens, args.repeats)
    loaded = None if tp > 1 else random_loaded_model(args.shape, hf, config.torch_dtype, config.device)
    del hf  # its memory goes to our KV pool
    gc.collect()
    torch.cuda.empty_cache()
    if loaded is None:
        from kvserve.bench.shapes import load_random_shard
        from kvserve.engine.tensor_parallel.launch import start_tp_engine

        engine = start_tp_engine(config, functools.partial(load_random_shard, shape=args.shape))
    else:
        engine = EngineCore(config, loaded)
    try:
        ours = bench_kvserve(engine, prefill_lens, concurrency, args.decode_tokens, args.repeats)
    finally:
        engine.shutdown()  # stops the other tensor-parallel ranks

    table = Table(
        "metric", "kvserve", "transformers", "ratio", title=f"kvserve bench engine ({args.shape}, TP={tp})"
    )
    for n, value in ours.prefill_tok_s.items():
        _row(table, f"prefill {n} tok (tok/s)", value, peer.prefill_tok_s.get(n) if peer else None)
    for c, value in ours.decode_tok_s.items():
        _row(table, f"decode x{c} (tok/s)", value, peer.decode_tok_s.get(c) if peer else None)
    table.add_row("roofline decode x1 (tok/s)", f"{roofline.decode_tok_s_batch1:.0f}", "", "")
    Console().print(table)
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "kvserve " + " ".join(sys.argv[1:]),
        "shape": args.shape,
        "dtype": config.dtype,
        "tensor_parallel_size": tp,
        "attention_backend": engine.runner.attention_backend,
        "cuda_graphs": engine.runner.graphs is not None,
        "num_kv_blocks": engine.num_blocks,
        "gpu": dataclasses.asdict(gpu_info()),
        "roofline": roofline.to_json(),
        "kvserve": ours.to_json(),
        "transformers": peer.to_json() if peer else None,
    }
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _row(table, label: str, ours: float, theirs: float | None) -> None:
    ratio = f"{ours / theirs:.2f}x" if theirs else "-"
    table.add_row(label, f"{ours:.0f}", f"{theirs:.0f}" if theirs else "-", ratio)
