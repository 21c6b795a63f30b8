"""`kvserve bench quality`: perplexity, KL divergence and top-1 agreement of each fast path against
the dense fp32 reference, on kvserve's engine, beside llama.cpp's `llama-perplexity` on the same GGUF
and text (kvserve/bench/quality.py says why it is a bench and not an eval)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
from pathlib import Path

from kvserve.bench.quality_rows import CONFIG_ROW, DEFAULT_TEXT, ROWS, SCORE_MODES
from kvserve.cli.engine_args import add_engine_args, engine_config_from_args

DEFAULT_ROWS = (CONFIG_ROW, *ROWS)


def register(bench_sub: argparse._SubParsersAction) -> None:
    q = bench_sub.add_parser(
        "quality",
        help="perplexity and KL divergence of each fast path against dense fp32, beside llama-perplexity",
        description=__doc__,
    )
    q.add_argument(
        "--text",
        type=Path,
        default=DEFAULT_TEXT,
        help="plain-text file to score (default: "
        "the first chapter and a half of Alice's Adventures in Wonderland, public domain)",
    )
    q.add_argument(
        "--chunk-ctx",
        type=int,
        default=512,
        metavar="N",
        help="tokens per chunk, llama-perplexity's -c; the second half of each is scored (default 512)",
    )
    q.add_argument(
        "--stride",
        type=int,
        default=0,
        metavar="N",
        help="a chunk every N tokens (default: --chunk-ctx, llama-perplexity's non-overlapping chunks)",
    )
    q.add_argument(
        "--chunks", type=int, default=0, metavar="N", help="score only the first N chunks (0: all)"
    )
    q.add_argument(
        "--mode",
        choices=SCORE_MODES,
        default="decode",
        help="decode: scored tokens are one-token decode steps after a prompt, as an answer's "
        "tokens are (default); prompt: each chunk is one prompt; reuse: all tokens are decode steps, "
        "so the context's KV is decode's, as a next turn's cached answer",
    )
    q.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help=f"comma-separated, from {', '.join(DEFAULT_ROWS)}; {CONFIG_ROW} = the engine flags given",
    )
    q.add_argument(
        "--reference-dir",
        type=Path,
        default=None,
        help="keep the reference's log-probabilities here and reuse them when model and text "
        "match (default: a temporary folder)",
    )
    q.add_argument("--no-peer", action="store_true", help="do not run llama-perplexity")
    q.add_argument("--threads", type=int, default=None, help="threads for both engines (default: torch's)")
    q.add_argument("--json", default=None, metavar="PATH", help="also write the results here ('-': stdout)")
    add_engine_args(q)
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    import torch

    rows = [name.strip() for name in args.rows.split(",") if name.strip()]
    unknown = [name for name in rows if name not in DEFAULT_ROWS]
    if unknown:
        sys.exit(f"kvserve: unknown --rows {', '.join(unknown)} (one of {', '.join(DEFAULT_ROWS)})")
    if not args.text.is_file():
        sys.exit(f"kvserve: --text {args.text}: no such file")
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="kvserve-quality-") as scratch:
        report = measure(args, rows, Path(scratch))
    print_report(report)
    if args.json == "-":
        print(json.dumps(report, indent=2))
    elif args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


def measure(args: argparse.Namespace, rows: list[str], scratch: Path) -> dict:
    """The reference once, then every row against it, then llama-perplexity; the report as JSON."""
    from kvserve.bench.quality import (
        ReferenceStore,
        describe,
        free_engine_memory,
        reference_run,
        run_row,
    )
    from kvserve.bench.quality_rows import reference_config
    from kvserve.config import resolve
    from kvserve.engine.build import build_engine

    def build(config):
        return build_engine(config, progress=False)

    flags = engine_config_from_args(args)
    reference_engine = build(reference_config(flags))
    text = _scored_text(reference_engine, args)
    store = ReferenceStore(args.reference_dir or scratch / "reference")
    reference = reference_run(reference_engine, text, store)
    del reference_engine
    free_engine_memory()
    model_context = reference.facts["model_context"]
    results: list[dict] = []
    for name in rows:
        if name == CONFIG_ROW:
            what, config = "", flags
        else:
            what, config = ROWS[name].what, ROWS[name].config(reference_config(flags), model_context)
        try:
            resolve(config)
        except ValueError as error:
            # A path this device does not have (an fp16 KV under an fp32 CUDA engine, say): the row
            # says so and the others still run.
            results.append({"name": name, "skipped": str(error)})
            print(f"{name}: skipped: {error}", file=sys.stderr)
            continue
        result = run_row(build, name, what, config, text, reference)
        if name == CONFIG_ROW:
            result = dataclasses.replace(result, what=f"the flags given: {describe(result.settings)}")
        results.append(result.to_json())
        print(f"{name}: done in {result.seconds:.1f} s", file=sys.stderr)
    return {
        "model": args.model,
        "text": str(args.text),
        "chunk_ctx": args.chunk_ctx,
        "stride": args.stride or args.chunk_ctx,
        "num_chunks": len(text.chunks),
        "num_scored": text.num_scored,
        "mode": args.mode,
        "threads": args.threads,
        "cpu": _cpu_name(),
        "reference": {
            "perplexity": reference.scores.perplexity,
            "perplexity_stderr": reference.scores.perplexity_stderr,
            **reference.facts,
        },
        "rows": results,
        "llama_cpp": _llama_row(args, text, reference, scratch),
    }


def _scored_text(engine, args: argparse.Namespace):  # -> ScoredText
    """The text's tokens as llama-perplexity makes them (BOS first where the model adds one)."""
    from kvserve.bench.perplexity import chunk_plan
    from kvserve.bench.quality import ScoredText

    tokenizer = engine.loaded.tokenizer
    if args.chunk_ctx > engine.max_model_len:
        sys.exit(
            f"kvserve: --chunk-ctx {args.chunk_ctx} exceeds the model's context ({engine.max_model_len})"
        )
    if tokenizer.tokenizer is None:
        sys.exit("kvserve: the model has no tokenizer")
    token_ids = tokenizer.tokenizer.encode(args.text.read_text(encoding="utf-8"), add_special_tokens=False)
    bos = tokenizer.bos_token_id if tokenizer.add_bos_token else None
    if bos is not None:
        token_ids = [bos, *token_ids]
    try:
        chunks = chunk_plan(len(token_ids), args.chunk_ctx, args.stride, args.chunks)
    except ValueError as error:
        sys.exit(f"kvserve: {error}")
    return ScoredText(token_ids, bos, chunks, args.mode)


def _llama_row(args: argparse.Namespace, text, reference, scratch: Path) -> dict:
    """llama-perplexity's figures on the same file, or {"skipped": why}."""
    from kvserve.bench.llama_perplexity import find_llama_perplexity, run_llama_perplexity
    from kvserve.bench.perplexity import compare, score, scored_targets
    from kvserve.models.loader.paths import resolve_model_path

    if args.no_peer:
        return {"skipped": "--no-peer"}
    binary = find_llama_perplexity()
    if binary is None:
        return {"skipped": "no llama-perplexity binary (build it with `make llama-perplexity`)"}
    gguf = resolve_model_path(args.model)
    if gguf.suffix != ".gguf":
        return {"skipped": "llama.cpp needs a GGUF model"}
    if (args.stride or args.chunk_ctx) != args.chunk_ctx:
        return {"skipped": "llama-perplexity's chunks do not overlap: run with the default --stride"}
    try:
        run = run_llama_perplexity(
            binary,
            gguf,
            args.text,
            ctx=args.chunk_ctx,
            threads=args.threads,
            max_chunks=args.chunks,
            workdir=scratch,
        )
    except RuntimeError as error:
        return {"skipped": f"llama-perplexity failed: {error}"}
    row = {
        "binary": str(binary),
        "perplexity": run.perplexity,
        "perplexity_stderr": run.perplexity_stderr,
        "seconds": run.seconds,
    }
    ours = text.token_ids[: len(run.logits.token_ids)]
    if list(run.logits.token_ids) != ours or len(run.logits.logprobs) != text.num_scored:
        return {**row, "kl": "not compared: llama.cpp tokenizes the text differently"}
    logprobs = run.logits.logprobs
    scores = score(logprobs, scored_targets(text.token_ids, text.chunks))
    comparison = compare(reference.scores, reference.logprobs, scores, logprobs)
    return {**row, **comparison._asdict(), "ppl_ratio": run.perplexity / reference.scores.perplexity}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        name = ""
    return name or platform.processor() or platform.machine()


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"kvserve bench quality: {report['model']}, {report['num_scored']} tokens scored "
        f"({report['num_chunks']} chunks of {report['chunk_ctx']}, {report['mode']} mode), {report['cpu']}"
    )
    table = Table("row", "what", "PPL", "ΔPPL", "KL mean", "KL p99", "top-1", title=title)
    ref = report["reference"]
    table.add_row(
        "reference",
        "dense fp32 weights, fp32 KV, model's context",
        f"{ref['perplexity']:.4f}",
        "",
        "0",
        "0",
        "100%",
    )
    for row in report["rows"]:
        if "skipped" in row:
            table.add_row(row["name"], f"skipped: {row['skipped']}", "", "", "", "", "")
        else:
            table.add_row(row["name"], row["what"], *_figures(row))
    llama = report["llama_cpp"]
    if "skipped" in llama:
        table.add_row("llama.cpp", f"skipped: {llama['skipped']}", "", "", "", "", "")
    elif "kl_mean" in llama:
        table.add_row("llama.cpp", "llama-perplexity, same GGUF (its defaults)", *_figures(llama))
    else:
        table.add_row("llama.cpp", llama["kl"], f"{llama['perplexity']:.4f}", "", "", "", "")
    Console(stderr=True, width=None if sys.stderr.isatty() else 140).print(table)


def _figures(row: dict) -> tuple[str, ...]:
    return (
        f"{row['perplexity']:.4f}",
        f"{(row['ppl_ratio'] - 1) * 100:+.2f}%",
        _small(row["kl_mean"]),
        _small(row["kl_p99"]),
        f"{row['top1_agreement'] * 100:.1f}%",
    )


def _small(value: float) -> str:
    return f"{value:.6f}" if value == 0 or value >= 1e-4 else f"{value:.1e}"
