"""`kvserve bench quality`'s edges that need no model: its flags, unknown rows, and the llama.cpp
row's skip message when there is no `llama-perplexity` binary."""

from __future__ import annotations

import argparse

import pytest

from kvserve.cli import bench_quality


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_quality.register(parser.add_subparsers())
    return parser.parse_args(["quality", *argv])


def test_the_defaults_are_llama_perplexitys_chunks_and_every_row() -> None:
    args = _args()
    assert (args.chunk_ctx, args.stride, args.chunks, args.mode) == (512, 0, 0, "decode")
    assert args.rows.split(",") == [
        "config",
        "int4",
        "int8",
        "fp16-kv",
        "bf16-prefill",
        "int8-prefill",
        "yarn-x2",
        "yarn-x4",
        "yarn-x2-static",
        "yarn-x4-static",
    ]
    assert args.text.is_file() and args.text.stat().st_size > 10_000


def test_an_unknown_row_is_refused_before_any_model_loads() -> None:
    with pytest.raises(SystemExit, match="unknown --rows fp8"):
        bench_quality.run(_args("--rows", "config,fp8"))


def test_without_the_binary_the_llama_row_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvserve.bench import llama_perplexity

    monkeypatch.setattr(llama_perplexity, "find_llama_perplexity", lambda: None)
    row = bench_quality._llama_row(_args(), text=None, reference=None, scratch=None)  # type: ignore[arg-type]
    assert row == {"skipped": "no llama-perplexity binary (build it with `make llama-perplexity`)"}
    assert bench_quality._llama_row(_args("--no-peer"), None, None, None) == {"skipped": "--no-peer"}  # type: ignore[arg-type]
