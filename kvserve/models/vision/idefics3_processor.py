"""Idefics3 / SmolVLM image preprocessing: one RGB image -> the normalized tiles the vision encoder
reads, as transformers' `Idefics3ImageProcessorPil` computes them, without transformers.

The image is resized so that its longest edge is `longest_edge` (upscaled too), then up to whole
multiples of `tile_size` and cut into tiles row by row; a copy squashed to one tile (the "global
image") always comes last. Every resize is Pillow's on uint8 pixels, as transformers' are, and the
float arithmetic rounds as transformers' does, so the tiles match it bit for bit.
`idefics3_prompt.py` writes the image's text into the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image as PILImage

from kvserve.models.vision.pixel_values import normalize_uint8, read_processor_settings, triple

if TYPE_CHECKING:
    import torch

# transformers' MAX_IMAGE_SIZE: the resized image's longest edge never exceeds it.
_MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class Idefics3ProcessorConfig:
    """The image processor's settings (HF's names, `size` and `max_image_size` flattened); the
    defaults are SmolVLM-256M/500M-Instruct's files."""

    do_resize: bool = True
    longest_edge: int = 2048  # size["longest_edge"]: what the image is resized to first
    resample: PILImage.Resampling = PILImage.Resampling.LANCZOS
    do_image_splitting: bool = True
    tile_size: int = 512  # max_image_size["longest_edge"]: the vision encoder's square input
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_seq_len: int = 64  # decoder tokens per tile (processor_config.json)

    @staticmethod
    def from_hf(hf: Mapping[str, Any], image_seq_len: int | None = None) -> Idefics3ProcessorConfig:
        """A `preprocessor_config.json` dict (and `processor_config.json`'s `image_seq_len`)."""
        default = Idefics3ProcessorConfig()
        return Idefics3ProcessorConfig(
            do_resize=bool(hf.get("do_resize", default.do_resize)),
            longest_edge=int(hf.get("size", {}).get("longest_edge", default.longest_edge)),
            resample=PILImage.Resampling(hf.get("resample", default.resample)),
            do_image_splitting=bool(hf.get("do_image_splitting", default.do_image_splitting)),
            tile_size=int(hf.get("max_image_size", {}).get("longest_edge", default.tile_size)),
            do_rescale=bool(hf.get("do_rescale", default.do_rescale)),
            rescale_factor=float(hf.get("rescale_factor", default.rescale_factor)),
            do_normalize=bool(hf.get("do_normalize", default.do_normalize)),
            image_mean=triple(hf.get("image_mean", default.image_mean)),
            image_std=triple(hf.get("image_std", default.image_std)),
            image_seq_len=default.image_seq_len if image_seq_len is None else int(image_seq_len),
        )

    @staticmethod
    def from_folder(path: Path) -> Idefics3ProcessorConfig:
        """An HF model folder's settings. transformers 5 saves them nested in processor_config.json
        and reads that first; older folders have preprocessor_config.json. Neither: the defaults."""
        image_processor, processor = read_processor_settings(path)
        return Idefics3ProcessorConfig.from_hf(image_processor, processor.get("image_seq_len"))


@dataclass(frozen=True, eq=False)
class ProcessedImage:
    """One image as the encoder reads it. rows x cols tiles (0 x 0 when the image is not split),
    then the global image: `num_tiles` is always rows * cols + 1."""

    pixel_values: torch.Tensor  # [num_tiles, 3, tile_size, tile_size] float32
    rows: int
    cols: int

    @property
    def num_tiles(self) -> int:
        return self.rows * self.cols + 1


def process_image(image: PILImage.Image, config: Idefics3ProcessorConfig) -> ProcessedImage:
    """An RGB image (`kvserve.chat.image.Image.rgb()`: transparency on white, as transformers'
    `convert_to_rgb`) -> its tiles. Each image is processed alone, so HF's `do_pad` (zero tiles
    up to the batch's largest image count) never applies."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image (Image.rgb() converts one), got mode {image.mode!r}")
    import torch  # here: the API process imports this module for `image_grid` without torch

    side = config.tile_size
    if config.do_resize:
        image = image.resize(_longest_edge_size(image.size, config.longest_edge), config.resample)
    if not config.do_image_splitting:
        tiles, rows, cols = [np.asarray(image.resize((side, side), config.resample))], 0, 0
    else:
        image = image.resize(_tile_multiple_size(image.size, side), config.resample)
        tiles, rows, cols = _split(image, side, config.resample)
    return ProcessedImage(torch.from_numpy(_normalize(np.stack(tiles), config)), rows, cols)


def image_grid(width: int, height: int, config: Idefics3ProcessorConfig) -> tuple[int, int]:
    """(rows, cols) that `process_image` gives an image of this size, from the size alone: the API
    process expands a prompt's placeholders without decoding the pixels (the engine does that,
    and only for images its encoder cache lacks)."""
    size = (width, height)
    if config.do_resize:
        size = _longest_edge_size(size, config.longest_edge)
    if not config.do_image_splitting:
        return 0, 0
    tiled_width, tiled_height = _tile_multiple_size(size, config.tile_size)
    rows, cols = tiled_height // config.tile_size, tiled_width // config.tile_size
    return (0, 0) if rows == cols == 1 else (rows, cols)


def _split(
    image: PILImage.Image, side: int, resample: PILImage.Resampling
) -> tuple[list[np.ndarray], int, int]:
    """An image of whole tiles -> its tiles row by row and the global image; one tile is not split."""
    rows, cols = image.height // side, image.width // side
    if rows == cols == 1:
        return [np.asarray(image)], 0, 0
    pixels = np.asarray(image)  # [height, width, 3] uint8
    tiles = [
        pixels[r * side : (r + 1) * side, c * side : (c + 1) * side] for r in range(rows) for c in range(cols)
    ]
    # The global image is squashed from the tile-multiple image, not from the original.
    return [*tiles, np.asarray(image.resize((side, side), resample))], rows, cols


def _normalize(tiles: np.ndarray, config: Idefics3ProcessorConfig) -> np.ndarray:
    """uint8 [num_tiles, side, side, 3] -> float32 [num_tiles, 3, side, side], as transformers rounds."""
    rescale = config.rescale_factor if config.do_rescale else None
    mean, std = (config.image_mean, config.image_std) if config.do_normalize else (None, None)
    return normalize_uint8(tiles, rescale, mean, std)


def _longest_edge_size(size: tuple[int, int], longest_edge: int) -> tuple[int, int]:
    """(width, height) with the longest edge at `longest_edge` and the other one truncated, then
    rounded up to even, then capped at 4096 (transformers' two `_resize_output_size_*` steps)."""
    width, height = size
    aspect_ratio = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect_ratio)
        height += height % 2
    else:
        width, height = int(longest_edge * aspect_ratio), longest_edge
        width += width % 2
    width, height = max(width, 1), max(height, 1)
    aspect_ratio = width / height
    if width >= height and width > _MAX_IMAGE_SIZE:
        width, height = _MAX_IMAGE_SIZE, int(_MAX_IMAGE_SIZE / aspect_ratio)
    elif height > width and height > _MAX_IMAGE_SIZE:
        width, height = int(_MAX_IMAGE_SIZE * aspect_ratio), _MAX_IMAGE_SIZE
    return max(width, 1), max(height, 1)


def _tile_multiple_size(size: tuple[int, int], side: int) -> tuple[int, int]:
    """(width, height) rounded up to whole tiles; the short edge is first rescaled from the rounded
    long edge's ratio, as transformers' `resize_for_vision_encoder` does."""
    width, height = size
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / side) * side
        height = math.ceil(int(width / aspect_ratio) / side) * side
    else:
        height = math.ceil(height / side) * side
        width = math.ceil(int(height * aspect_ratio) / side) * side
    return width, height
