"""Qwen2-VL / Qwen2.5-VL image preprocessing: one RGB image -> the flattened patches the vision
tower reads, as transformers' `Qwen2VLImageProcessorPil` computes them, without transformers.

The image is resized (Pillow, on uint8 pixels, as transformers does) to sides that are multiples of
patch x merge with a pixel count in [min_pixels, max_pixels] (`smart_resize`), normalized, repeated
to `temporal_patch_size` frames and cut into patches, each merge x merge block of patches
consecutive (the order the tower's patch merger reads). The patch grid comes from the size alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from PIL import Image as PILImage

from kvserve.models.vision.pixel_values import normalize_uint8, read_processor_settings, triple

if TYPE_CHECKING:
    import torch

# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, the processor's defaults.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200  # smart_resize refuses longer strips


@dataclass(frozen=True)
class Qwen2VLProcessorConfig:
    """The image processor's settings (HF's names; `size`'s shortest/longest_edge are the min/max
    pixel counts); the defaults are transformers' `Qwen2VLImageProcessorPil`'s."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    resample: PILImage.Resampling = PILImage.Resampling.BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merged token's side in pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: 3 channels x frames x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    @staticmethod
    def from_hf(hf: Mapping[str, Any]) -> Qwen2VLProcessorConfig:
        """A `preprocessor_config.json` dict. `min_pixels`/`max_pixels` win over `size`, as in
        transformers' `__init__`; ValueError for settings the tower cannot take (no resize)."""
        if not hf.get("do_resize", True):
            raise ValueError("a Qwen2-VL image processor without do_resize is not supported")
        default = Qwen2VLProcessorConfig()
        size = hf.get("size") or {}
        return Qwen2VLProcessorConfig(
            min_pixels=int(hf.get("min_pixels") or size.get("shortest_edge") or default.min_pixels),
            max_pixels=int(hf.get("max_pixels") or size.get("longest_edge") or default.max_pixels),
            patch_size=int(hf.get("patch_size", default.patch_size)),
            temporal_patch_size=int(hf.get("temporal_patch_size", default.temporal_patch_size)),
            merge_size=int(hf.get("merge_size", default.merge_size)),
            resample=PILImage.Resampling(hf.get("resample", default.resample)),
            do_rescale=bool(hf.get("do_rescale", default.do_rescale)),
            rescale_factor=float(hf.get("rescale_factor", default.rescale_factor)),
            do_normalize=bool(hf.get("do_normalize", default.do_normalize)),
            image_mean=triple(hf.get("image_mean", default.image_mean)),
            image_std=triple(hf.get("image_std", default.image_std)),
        )

    @staticmethod
    def from_folder(path: Path) -> Qwen2VLProcessorConfig:
        """An HF model folder's settings (processor_config.json's, else preprocessor_config.json's)."""
        return Qwen2VLProcessorConfig.from_hf(read_processor_settings(path)[0])

    def grid(self, width: int, height: int) -> PatchGrid:
        """The patch grid `process_image` gives an image of this size, from the size alone."""
        resized_height, resized_width = smart_resize(
            height, width, self.factor, self.min_pixels, self.max_pixels
        )
        return PatchGrid(1, resized_height // self.patch_size, resized_width // self.patch_size)


class PatchGrid(NamedTuple):
    """An image's patches: t frames (1 for an image) of h x w patches; the decoder sees
    (t, h / merge, w / merge) tokens."""

    t: int
    h: int
    w: int

    @property
    def num_patches(self) -> int:
        return self.t * self.h * self.w


@dataclass(frozen=True, eq=False)
class ProcessedImage:
    pixel_values: torch.Tensor  # [grid.num_patches, patch_dim] float32
    grid: PatchGrid


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, rescaled (keeping the aspect ratio as near
    as the rounding allows) into [min_pixels, max_pixels]: transformers' `smart_resize`, float ops
    and all. ValueError for an aspect ratio over 200."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"an image's aspect ratio must be at most {MAX_ASPECT_RATIO}, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def process_image(image: PILImage.Image, config: Qwen2VLProcessorConfig) -> ProcessedImage:
    """An RGB image (`kvserve.chat.image.Image.rgb()`) -> its patches and grid."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image (Image.rgb() converts one), got mode {image.mode!r}")
    import torch  # here: the API process imports this module for `grid` without torch

    grid = config.grid(image.width, image.height)
    size = (grid.w * config.patch_size, grid.h * config.patch_size)
    pixels = np.asarray(image.resize(size, config.resample))  # [height, width, 3] uint8
    rescale = config.rescale_factor if config.do_rescale else None
    mean, std = (config.image_mean, config.image_std) if config.do_normalize else (None, None)
    patches = patchify(normalize_uint8(pixels, rescale, mean, std), config)
    return ProcessedImage(torch.from_numpy(patches), grid)


def patchify(image: np.ndarray, config: Qwen2VLProcessorConfig) -> np.ndarray:
    """float32 [3, height, width] -> [num_patches, 3 * frames * patch * patch]: merge blocks
    row-major, patches row-major inside a block, each patch (channel, frame, row, col) with the one
    image repeated as every frame (transformers' element order)."""
    channels, height, width = image.shape
    p, m, frames = config.patch_size, config.merge_size, config.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    patches = image.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, channels, p, p]
    patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], frames, p, p))
    return np.ascontiguousarray(patches.reshape(grid_h * grid_w, channels * frames * p * p))
