"""YaRN on demand on a real model: a short prompt's next-token logits under `--ctx 2x` are the model's
at its own context, a prompt past the trained context's are static YaRN's (`--rope-scaling yarn`).

    PYTHONPATH=. python scripts/rope_on_demand_check.py --model smollm2 [--device cuda] [--long 8400]

Each prompt runs alone on three engines (its own context, on demand, static) with fp32 weights and
KV, and the script prints the largest |difference| of the last position's logits between them.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from kvserve.bench.quality_rows import DEFAULT_TEXT
from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.core import EngineCore
from kvserve.engine.outputs import RunnerOutput
from kvserve.engine.sampling_params import SamplingParams


def last_logits(engine: EngineCore, prompt: list[int]) -> tuple[torch.Tensor, bool]:
    """The logits that sample the prompt's first answer token, and whether it ran as trained."""
    request = engine.make_request("check", prompt, SamplingParams(max_tokens=16, temperature=0))
    engine.add_request(request)
    logits = None
    while logits is None:  # the prompt's chunks; the last one samples
        plan = engine.scheduler.schedule()
        logits, _ = engine.runner.forward(plan.scheduled)
        output = RunnerOutput()
        if logits is not None:
            output.sampled_token_ids[request.request_id] = int(logits[0].argmax())
        engine.scheduler.update(plan, output)
    engine.abort_request(request.request_id)
    engine.step()
    return logits[0].float().cpu(), request.uses_trained_rope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--short", type=int, default=512, help="tokens of the short prompt")
    parser.add_argument(
        "--long", type=int, default=8400, help="tokens of the long prompt (past the trained context)"
    )
    args = parser.parse_args()
    base = EngineConfig(
        model=args.model,
        dtype="float32",
        device=args.device,
        weight_quant="none",
        cache=CacheConfig(kv_dtype="float32", kv_cache_memory_mb=2048),
        kv_store=None,
    )
    own = build_engine(base, progress=False)
    trained = own.max_model_len
    engines = {"own": own}
    for name, scaling in (("on_demand", None), ("static", "yarn")):
        config = dataclasses.replace(base, max_model_len=2 * trained, rope_scaling=scaling)
        engines[name] = build_engine(config, progress=False)
    tokenizer = own.loaded.tokenizer.tokenizer
    text = DEFAULT_TEXT.read_text()
    tokens = tokenizer.encode(text)
    while len(tokens) < args.long:  # the text again: only positions matter here, not its sense
        tokens += tokenizer.encode(text)
    for name, length in (("short", args.short), ("long", args.long)):
        prompt = tokens[:length]
        results = {}
        for engine_name, engine in engines.items():
            if engine_name == "own" and length >= trained:
                continue
            results[engine_name] = last_logits(engine, prompt)
        logits, is_trained = results["on_demand"]
        line = f"{name} prompt ({length} tokens): on demand runs {'as trained' if is_trained else 'scaled'}"
        for other in ("own", "static"):
            if other in results:
                diff = (logits - results[other][0]).abs().max().item()
                line += f"; max |logits - {other}| = {diff:.3g}"
        print(line)


if __name__ == "__main__":
    main()
