"""Qwen2.5-VL's vision tower at Qwen2.5-VL-3B-Instruct's shapes with random weights (the arithmetic's
cost does not depend on them): kvserve's (`Qwen2_5VisionTransformer`) beside transformers'
(`Qwen2_5_VisionTransformerPretrainedModel`, SDPA) on the same weights, one image of each size at
a time, taking turns: the best seconds per image of each and the largest difference of their
outputs.

    python3 scripts/qwen_vision_bench.py --device cuda --dtype bfloat16 --sizes 448x448 1280x720 1920x1080
    python3 scripts/qwen_vision_bench.py --threads 2 --depth 4 --sizes 224x224

Run from the repository root (it takes the shapes from tests/models/tiny_qwen_vl.py).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from kvserve.models.vision.config import qwen2_5_vl_vision_from_hf
from kvserve.models.vision.qwen2_5_vl_vision import Qwen2_5VisionTransformer
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig
from tests.models.tiny_qwen_vl import QWEN25_VL_3B, hf_config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)"
    )
    parser.add_argument("--depth", type=int, default=0, help="fewer blocks than the 3B's 32 (0: all)")
    parser.add_argument("--sizes", nargs="+", default=["448x448", "1280x720"], help="WIDTHxHEIGHT")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hf, ours = _towers(args.depth, torch.device(args.device), getattr(torch, args.dtype))
    processor = Qwen2VLProcessorConfig()  # transformers' default pixel budget (28 x 28 x 1280 at most)
    results = []
    for size in args.sizes:
        width, height = (int(v) for v in size.split("x"))
        grid = processor.grid(width, height)
        pixels = torch.randn(grid.num_patches, processor.patch_dim, device=args.device)
        grid_thw = torch.tensor([list(grid)], device=args.device)
        runs = {"transformers": lambda p, g: _rows(hf(p, grid_thw=g)), "kvserve": ours}
        with torch.no_grad():
            (hf_s, expected), (ours_s, got) = _best_times(runs, pixels, grid_thw, args.repeats).values()
        diff = (got.float() - expected.float()).abs().max().item()
        scale = expected.float().abs().max().item()
        row = {"size": size, "patches": grid.num_patches, "tokens": grid.num_patches // 4,
               "kvserve_s": ours_s, "transformers_s": hf_s, "max_abs_diff": diff, "max_abs": scale}  # fmt: skip
        results.append(row)
        print(json.dumps(row))
    report = {
        "device": _device_name(args.device),
        "dtype": args.dtype,
        "depth": args.depth or 32,
        "results": results,
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


def _towers(depth: int, device: torch.device, dtype: torch.dtype) -> tuple[Any, Qwen2_5VisionTransformer]:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    shapes = dict(QWEN25_VL_3B)
    if depth:
        full = [i for i in shapes["vision"]["fullatt_block_indexes"] if i < depth] or [depth - 1]
        shapes["vision"] = {**shapes["vision"], "depth": depth, "fullatt_block_indexes": full}
    config = hf_config(shapes, vocab_size=151936)
    config.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config, dtype=torch.float32)
    hf.init_weights()  # random weights of the usual scale, so the outputs are comparable
    ours = Qwen2_5VisionTransformer(qwen2_5_vl_vision_from_hf(config.to_dict()))
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf.to(device, dtype).eval(), ours.to(device, dtype).eval()


def _best_times(
    runs: dict[str, Any], pixels: torch.Tensor, grid_thw: torch.Tensor, repeats: int
) -> dict[str, tuple[float, torch.Tensor]]:
    """Each run's best time of `repeats` and its output, the runs taking turns (a shared machine's
    load then weighs on both alike)."""
    outs = {name: run(pixels, grid_thw) for name, run in runs.items()}  # warm-up: kernels, allocator
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            _sync()
            start = time.perf_counter()
            outs[name] = run(pixels, grid_thw)
            _sync()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], outs[name]) for name in runs}


def _rows(out: Any) -> torch.Tensor:
    """The merged rows: transformers 5.2x returns them as `pooler_output`, earlier 5.x as a tensor."""
    return getattr(out, "pooler_output", out)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    return (
        torch.cuda.get_device_name()
        if device.startswith("cuda")
        else f"cpu ({torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main()
