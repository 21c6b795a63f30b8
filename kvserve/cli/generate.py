"""`kvserve generate -p "..."`: complete a raw prompt, streaming tokens to stdout."""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from kvserve.chat.detokenizer import IncrementalDetokenizer
from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
from kvserve.cli.sampling_args import add_sampling_args, sampling_params_from_args
from kvserve.engine.build import build_engine


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete a raw prompt (no chat template), streaming")
    p.add_argument("-p", "--prompt", help="prompt text (default: read stdin)")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    engine = build_engine(engine_config_from_args(args))
    tok = engine.loaded.tokenizer
    token_ids = tok.tokenizer.encode(prompt, add_special_tokens=False)
    if tok.add_bos_token and tok.bos_token_id is not None:
        token_ids = [tok.bos_token_id, *token_ids]
    params = sampling_params_from_args(args)
    stream_tokens(engine, token_ids, params)


def stream_tokens(engine, token_ids: list[int], params) -> str:
    """Run one request on the engine, printing text as it becomes complete; returns the text."""
    request = engine.make_request(uuid.uuid4().hex, token_ids, params)
    detok = IncrementalDetokenizer(engine.loaded.tokenizer.tokenizer, token_ids)
    engine.add_request(request)
    start, first, pieces = time.perf_counter(), None, []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.new_token_ids and first is None:
                first = time.perf_counter()
            pieces.append(detok.push(output.new_token_ids))
            print(pieces[-1], end="", flush=True)
    pieces.append(detok.flush())
    print(pieces[-1], flush=True)
    n = request.num_output_tokens
    elapsed = time.perf_counter() - (first or start)
    print(
        f"[{len(token_ids)} prompt tokens ({request.num_cached_tokens} cached), {n} generated, "
        f"TTFT {(first or start) - start:.2f}s, {max(n - 1, 0) / max(elapsed, 1e-9):.1f} tok/s]",
        file=sys.stderr,
    )
    return "".join(pieces)
