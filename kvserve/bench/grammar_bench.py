"""What grammar-constrained decoding costs per decode step: `python -m kvserve.bench.grammar_bench`.

Runs the same greedy decode (one stream, then `--streams` concurrent) free and under a JSON-schema
constraint, on the same engine in the same run, alternating, and reports the median step time of
each, plus the pieces the constraint adds: the host-side mask fill (llguidance) and token advance per
row, and the mask application per step. Medians of CPU time (process/thread time), not wall time:
the machines here are shared, and a descheduled process makes wall times meaningless there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.engine.core import EngineCore
from kvserve.engine.runner.token_masks import build_token_masks
from kvserve.engine.sampler import apply_token_bitmask
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar.compiler import GrammarCompiler, tokenizer_factory
from kvserve.grammar.json_format import json_grammar

# Cannot finish within `--tokens` steps, so both runs decode the same number of steps.
SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 1000}


def decode_step_ms(
    engine: EngineCore, compiler: GrammarCompiler | None, streams: int, tokens: int
) -> list[float]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    vocab = engine.loaded.arch.vocab_size
    for i in range(streams):
        constraint = None if compiler is None else compiler.constraint(json_grammar(SCHEMA))
        engine.add_request(
            engine.make_request(f"b{time.monotonic_ns()}-{i}", make_prompt(64, vocab, i), params, constraint)
        )
    engine.step()  # every prefill fits one step
    times = []
    while engine.has_unfinished_requests():
        start = time.process_time()
        engine.step()
        times.append((time.process_time() - start) * 1e3)
    return times[1:-1]


def main() -> None:
    from kvserve.config import EngineConfig
    from kvserve.engine.build import build_engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = build_engine(
        EngineConfig(model=args.model, dtype=args.dtype, max_model_len=2048), progress=False
    )
    tokenizer = engine.loaded.tokenizer
    vocab = engine.loaded.arch.vocab_size
    compiler = GrammarCompiler(tokenizer_factory(tokenizer.tokenizer, vocab, tokenizer.eos_token_ids))
    result: dict[str, float] = {}
    for streams in (1, args.streams):
        free: list[float] = []
        constrained: list[float] = []
        for _ in range(args.repeats):
            free += decode_step_ms(engine, None, streams, args.tokens)
            constrained += decode_step_ms(engine, compiler, streams, args.tokens)
        result[f"free_step_ms_b{streams}"] = statistics.median(free)
        result[f"constrained_step_ms_b{streams}"] = statistics.median(constrained)
    request = engine.make_request("m", [1, 2, 3], SamplingParams(), compiler.constraint(json_grammar(SCHEMA)))
    result["mask_fill_ms_per_row"] = _median_ms(lambda: build_token_masks([request], vocab, pin_memory=False))
    token_ids = engine.loaded.tokenizer.tokenizer.encode('["a b c d e f g h i j k l m n o p", "q r s"')
    result["advance_ms_per_token"] = _median_ms(lambda: _advance(compiler, token_ids)) / len(token_ids)
    bitmask = build_token_masks([request] * args.streams, vocab, pin_memory=False).bitmask
    assert bitmask is not None
    logits = torch.randn(args.streams, vocab, device=engine.device)
    bitmask = bitmask.to(engine.device)
    result[f"mask_apply_ms_b{args.streams}"] = _median_ms(lambda: apply_token_bitmask(logits, bitmask))
    print(
        json.dumps(
            {
                "model": args.model,
                "device": str(engine.device),
                **{k: round(v, 3) for k, v in result.items()},
            },
            indent=1,
        )
    )


def _advance(compiler: GrammarCompiler, token_ids: list[int]) -> None:
    constraint = compiler.constraint(json_grammar(SCHEMA))
    for token_id in token_ids:
        constraint.accept_token(token_id)


def _median_ms(fn, n: int = 200) -> float:
    times = []
    for _ in range(n):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1e3)
    return statistics.median(times)


if __name__ == "__main__":
    main()
