"""Sampling flags for `generate` and `chat`."""

from __future__ import annotations

import argparse
import sys

from kvserve.engine.sampling_params import SamplingParams, SamplingParamsError


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("-n", "--max-tokens", type=int, default=256)
    g.add_argument("-t", "--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--sample-seed", type=int, default=None, help="per-request seed (reproducible)")
    g.add_argument("--ignore-eos", action="store_true")


def sampling_params_from_args(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            seed=args.sample_seed,
            max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
        )
    except SamplingParamsError as error:
        sys.exit(f"kvserve: {error}")
