"""A/B of the fp32 low-bit levers in one engine, interleaved (SmolLM2, --weight-quant int4): the
decode GEMVs on the x4 layout (lowbit_cpu.pack_for_decode) vs the row layout, alone at SmolLM2's
shapes and in whole decode steps; and the int4 prefill GEMM (--int8-prefill) vs the dense fp32 GEMM.

    .venv/bin/python scripts/cpu_lowbit_ab.py --threads 1

Each variant is switched on the same engine (same weights, same KV) and the variants alternate every
`--steps` decode steps (or every prefill, or every sweep of the kernels), so all see the same machine
load (the VMs here are shared).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext, lowbit_cpu
from kvserve.models.layers.quant import WeightOnlyLinear

# SmolLM2's decode GEMVs: (N, K, gated) of qkv, o, gate_up, down, and the LM head (int8, fp32 input).
LAYER_SHAPES = ((960, 576, False), (576, 576, False), (3072, 576, True), (576, 1536, False))
HEAD_SHAPE = (49152, 576)
NUM_LAYERS = 30


def set_variant(
    engine: EngineCore, *, stack: bool, gemm: bool, layers_x4: bool = True, head_x4: bool = True
) -> None:
    """Switch the levers (module-level toggles restored by the next call)."""
    causal_lm = engine.runner.model
    causal_lm.model.use_fused_stack = stack  # False: the per-layer path
    lowbit_cpu.lowbit_gemm = _GEMM if gemm else (lambda *args, **kwargs: None)
    for module in causal_lm.modules():
        if isinstance(module, WeightOnlyLinear) and module.bits is not None:
            if not hasattr(module, "_x4"):
                module._x4 = module.packed  # type: ignore[attr-defined]
            use = head_x4 if not module.quantize_input else layers_x4
            module.packed = module._x4 if use else None  # type: ignore[attr-defined]
    causal_lm.select_kernels()  # the decode stack holds the packed weights it was built with


_GEMM = lowbit_cpu.lowbit_gemm


def kernel_ab(repeats: int) -> None:
    """The 30 layers' GEMVs (66 MB: streamed from DRAM like a decode step) and the head, one activation
    row, row layout vs x4 layout, alternating every sweep; medians in ms and GB/s of weight bytes."""
    torch.manual_seed(0)
    layers = []
    for _ in range(NUM_LAYERS):
        for n, k, gated in LAYER_SHAPES:
            qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, 4)
            layers.append(
                (torch.randn(1, k), qweight, scales, lowbit_cpu.pack_for_decode(qweight, scales, 4), gated)
            )
    head_q, head_s = lowbit_cpu.quantize(torch.randn(*HEAD_SHAPE) * 0.05, 8)
    head_x4, head_x = lowbit_cpu.pack_for_decode(head_q, head_s, 8), torch.randn(1, HEAD_SHAPE[1])
    layer_bytes = sum(q.numel() + 2 * s.numel() for _, q, s, _, _ in layers)
    head_bytes = head_q.numel() + 2 * head_s.numel()

    def layers_ms(x4: bool) -> float:
        return timed(lambda: [lowbit_cpu.lowbit_linear(x, q, s, 4, gated=g, packed=p if x4 else None)
                              for x, q, s, p, g in layers])  # fmt: skip

    def head_ms(x4: bool) -> float:
        layers_ms(x4)  # the layers first, so that the head comes from DRAM as in a step
        return timed(lambda: lowbit_cpu.lowbit_linear(
            head_x, head_q, head_s, 8, quantize_x=False, packed=head_x4 if x4 else None))  # fmt: skip

    results: dict[str, list[float]] = {}
    for i in range(repeats + 1):  # round 0: warm-up, not kept
        for x4 in (False, True):
            for part, fn in (("30 layers' int4 GEMVs", layers_ms), ("LM head (int8, fp32 input)", head_ms)):
                ms = fn(x4)
                if i:
                    results.setdefault(f"{part}, {'x4' if x4 else 'row'} layout", []).append(ms)
    print(f"kernels, one activation row, medians (min) over {repeats} rounds:")
    for name, values in results.items():
        values.sort()
        gb = (head_bytes if "head" in name else layer_bytes) / values[len(values) // 2] / 1e6
        print(f"  {name:44s} {values[len(values) // 2]:6.2f} ms ({values[0]:5.2f})  {gb:5.1f} GB/s")


def timed(fn: Callable[[], None]) -> float:
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=512, help="0: no prefill A/B")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_ext.load() is not None, "the CPU kernels do not build or run here"
    kernel_ab(args.repeats)
    config = EngineConfig(
        model="smollm2",
        device="cpu",
        dtype="float32",
        weight_quant="int4",
        max_model_len=4096,
        int8_prefill=True,
    )
    engine = build_engine(config, progress=False)
    prefill_ms: dict[str, list[float]] = {"dense fp32 GEMM (before)": [], "int4 x int8 GEMM (after)": []}
    one_token = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    seeds = iter(range(1000, 2000))  # a fresh prompt every time: no prefix-cache hits
    for i in range(args.repeats + 1 if args.prefill_len else 0):  # round 0: warm-up, not kept
        for name, values in prefill_ms.items():
            set_variant(engine, stack=True, gemm=name.startswith("int4"))
            prompt = make_prompt(args.prefill_len, 49152, next(seeds))
            engine.add_request(engine.make_request(uuid.uuid4().hex, prompt, one_token))
            ms = timed(lambda: [engine.step() for _ in iter(engine.has_unfinished_requests, False)])
            if i:
                values.append(ms)
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    engine.add_request(engine.make_request(uuid.uuid4().hex, make_prompt(args.prompt_len, 49152, 7), params))
    for _ in range(3):
        engine.step()
    decode_variants = {
        "row layout (before)": {"stack": True, "gemm": True, "layers_x4": False, "head_x4": False},
        "x4 layers, row-layout head": {"stack": True, "gemm": True, "layers_x4": True, "head_x4": False},
        "x4 layers and head (after)": {"stack": True, "gemm": True, "layers_x4": True, "head_x4": True},
    }
    step_ms: dict[str, list[float]] = {name: [] for name in decode_variants}
    for _ in range(args.repeats):
        for name, variant in decode_variants.items():
            set_variant(engine, **variant)
            engine.step()  # builds the stack where it is on: not timed
            step_ms[name].append(timed(lambda: [engine.step() for _ in range(args.steps)]) / args.steps)
    set_variant(engine, stack=True, gemm=True)
    print(
        f"SmolLM2 fp32 --weight-quant int4, {args.threads} thread(s); medians (min) over {args.repeats} rounds"
    )
    print(f"decode, one stream, ~{args.prompt_len}-token context, ms per step:")
    for name, values in step_ms.items():
        values.sort()
        print(f"  {name:44s} {values[len(values) // 2]:6.1f} ({values[0]:5.1f})")
    if args.prefill_len:
        print(f"prefill of {args.prefill_len} tokens (one request, nothing else running), ms:")
    for name, values in prefill_ms.items() if args.prefill_len else ():
        values.sort()
        print(f"  {name:44s} {values[len(values) // 2]:6.1f} ({values[0]:5.1f})")


if __name__ == "__main__":
    main()
