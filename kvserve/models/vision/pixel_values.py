"""What every image processor here shares: uint8 pixels -> normalized float32 channels-first, with
transformers' rounding, and the HF folder's processor settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def normalize_uint8(
    pixels: np.ndarray,
    rescale_factor: float | None,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
) -> np.ndarray:
    """uint8 [..., height, width, 3] -> float32 [..., 3, height, width]: rescaled by `rescale_factor`
    (None: not), then normalized by `mean`/`std` (None: not). A pixel's value depends only on its
    byte and channel, so a 256-entry table per channel computed with transformers' rounding
    (rescaled in float64 then cast, normalized in float32) gives its exact values without a float64
    copy of the image."""
    table = np.arange(256, dtype=np.float32)
    if rescale_factor is not None:
        table = (np.arange(256, dtype=np.float64) * rescale_factor).astype(np.float32)
    table = np.repeat(table[None], 3, axis=0)  # [3, 256]
    if mean is not None and std is not None:
        mean_t, std_t = np.array(mean, np.float32), np.array(std, np.float32)
        table = (table - mean_t[:, None]) / std_t[:, None]
    channels_first = np.moveaxis(pixels, -1, -3)  # [..., 3, height, width]
    channels = np.arange(3).reshape(3, 1, 1)
    return table[channels, channels_first]


def triple(values: Any) -> tuple[float, float, float]:
    """A per-channel setting; HF accepts one number for all channels too."""
    if isinstance(values, (int, float)):
        return (float(values),) * 3
    first, second, third = (float(v) for v in values)
    return first, second, third


def read_processor_settings(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(image processor settings, processor settings) of an HF model folder. transformers 5 saves
    the first nested in processor_config.json and reads that first; older folders have
    preprocessor_config.json. Neither: empty dicts (the defaults)."""
    processor = _read_json(folder / "processor_config.json")
    return processor.get("image_processor") or _read_json(folder / "preprocessor_config.json"), processor


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
