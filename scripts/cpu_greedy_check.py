"""Greedy SmolLM2 answers of fp32 `--weight-quant` decode with and without the x4 weight layout
(lowbit_cpu.pack_for_decode), in one engine: the layout changes the order of float additions in the
int4 GEMVs, so this checks that it leaves the answers alone.

    .venv/bin/python scripts/cpu_greedy_check.py --weight-quant int4
    .venv/bin/python scripts/cpu_greedy_check.py --model gemma3-270m --weight-quant int4 --versus dense

`--versus dense` compares with a dense fp32 engine instead (the quantization's own effect: answers
may differ, and the printout says after how many tokens). Prints the questions whose answers differ
(with both texts) and exits 1 if any do.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from kvserve.config import EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.quant import WeightOnlyLinear

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one sentence.",
    "List three primary colors.",
    "What is 12 times 11?",
    "Translate 'good morning' into Spanish.",
    "Name a famous physicist.",
    "Why is the sky blue?",
)


def use_x4(engine: EngineCore, on: bool) -> None:
    # NOTE: a prefix-cache hit would prefill the prompt's tail (< 16 tokens) on the low-bit kernel
    # instead of the dense GEMM, which changes the answer by itself: each pass starts without one.
    engine.kv_manager.pool.reset_prefix_cache()
    for module in engine.runner.model.modules():
        if isinstance(module, WeightOnlyLinear) and module.bits is not None:
            if not hasattr(module, "_x4"):
                module._x4 = module.packed  # type: ignore[attr-defined]
            module.packed = module._x4 if on else None  # type: ignore[attr-defined]
    engine.runner.model.select_kernels()  # the decode stack holds the packed weights it was built with


def answers(engine: EngineCore, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One request at a time: single-stream decode, the path the layout is for."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    out = []
    for i, prompt in enumerate(prompts):
        request = engine.make_request(f"q{i}-{len(out)}-{id(prompts)}", prompt, params)
        outputs = engine.generate([request])
        out.append([t for o in outputs[request.request_id] for t in o.new_token_ids])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weight-quant", default="int4", choices=("int4", "int8"))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--versus", choices=("row-layout", "dense"), default="row-layout")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = EngineConfig(model=args.model, device="cpu", dtype="float32", weight_quant=args.weight_quant)
    engine = build_engine(config, progress=False)
    tokenizer = engine.loaded.tokenizer.tokenizer
    template = engine.loaded.tokenizer.chat_template
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                chat_template=template,
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        if template  # a base model without one (Gemma 3 270M's GGUF): a plain completion prompt
        else tokenizer.encode(f"Question: {q}\nAnswer:", add_special_tokens=True)
        for q in QUESTIONS
    ]
    if args.versus == "dense":
        dense = build_engine(dataclasses.replace(config, weight_quant="none"), progress=False)
        before, names = answers(dense, prompts, args.max_tokens), ("dense", args.weight_quant)
    else:
        use_x4(engine, False)
        before, names = answers(engine, prompts, args.max_tokens), ("row layout", "x4 layout")
        use_x4(engine, True)
    after = answers(engine, prompts, args.max_tokens)
    differ = [i for i in range(len(QUESTIONS)) if before[i] != after[i]]
    for i in differ:
        same = next(
            n for n, (a, b) in enumerate(zip(before[i] + [-1], after[i] + [-2], strict=False)) if a != b
        )
        print(f"{QUESTIONS[i]!r} (first {same} tokens identical)")
        print(f"  {names[0]}: {tokenizer.decode(before[i])!r}\n  {names[1]}: {tokenizer.decode(after[i])!r}")
    print(f"{args.weight_quant}: {len(QUESTIONS) - len(differ)} of {len(QUESTIONS)} greedy answers identical")
    print(f"e.g. {QUESTIONS[0]!r} -> {tokenizer.decode(after[0])!r}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
