"""Qwen2.5-VL prompt layout: the chat template writes `<|vision_start|><|image_pad|><|vision_end|>`
per image, and each `<|image_pad|>` becomes one per decoder token of the image (t x h x w patches /
merge**2), as transformers' `Qwen2_5_VLProcessor` writes them. An image's span is its run of
`<|image_pad|>`, with its merged (t, h, w) grid for the decoder's M-RoPE positions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.chat.image import Image
from kvserve.models.vision.config import Qwen2_5VisionConfig
from kvserve.models.vision.prompt_image import ImagePromptError, PromptImage, image_token_bounds
from kvserve.models.vision.qwen2_vl_processor import PatchGrid, Qwen2VLProcessorConfig, process_image

if TYPE_CHECKING:
    import torch

IMAGE_PAD = "<|image_pad|>"
WRAPPED_IMAGE_PAD = f"<|vision_start|>{IMAGE_PAD}<|vision_end|>"  # what the chat template writes


def token_grid(grid: PatchGrid, merge_size: int) -> tuple[int, int, int]:
    """(t, h, w) of an image's decoder tokens: its patch grid after merging merge x merge patches."""
    return grid.t, grid.h // merge_size, grid.w // merge_size


@dataclass(frozen=True)
class QwenVLPromptSpec:
    """Qwen2-VL / Qwen2.5-VL's `ImagePromptSpec`."""

    image_token_id: int
    processor: Qwen2VLProcessorConfig

    @staticmethod
    def for_model(vision: Qwen2_5VisionConfig, folder: Path) -> QwenVLPromptSpec:
        """The spec of a model with `vision` loaded from `folder` (its processor files)."""
        return QwenVLPromptSpec.from_processor(vision, Qwen2VLProcessorConfig.from_folder(folder))

    @staticmethod
    def from_processor(vision: Qwen2_5VisionConfig, processor: Qwen2VLProcessorConfig) -> QwenVLPromptSpec:
        """The spec of a tower fed by `processor` (a folder's, an mmproj's), whose patches must be
        the tower's (ValueError otherwise)."""
        ours = (processor.patch_size, processor.temporal_patch_size, processor.merge_size)
        tower = (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
        if ours != tower or vision.in_channels != 3:
            raise ValueError(
                f"the image processor's patches (size, frames, merge {ours}) are not the vision tower's {tower}"
            )
        return QwenVLPromptSpec(vision.image_token_id, processor)

    def token_grid(self, image: Image) -> tuple[int, int, int]:
        """The image's (t, h, w) decoder tokens, from its size alone."""
        try:
            grid = self.processor.grid(image.width, image.height)
        except ValueError as error:  # an aspect ratio over 200
            raise ImagePromptError(str(error)) from None
        return token_grid(grid, self.processor.merge_size)

    def expand(self, text: str, images: Sequence[Image]) -> str:
        """The rendered prompt with each `<|image_pad|>` repeated once per token of its image.

        NOTE: an `<|image_pad|>` a client typed as text counts too, as in transformers, and so does
        one the template did not wrap in `<|vision_start|>`/`<|vision_end|>`: where the counts differ
        this raises, rather than giving one image's tokens to another's place."""
        pieces = text.split(IMAGE_PAD)
        num_wrapped = text.count(WRAPPED_IMAGE_PAD)
        if len(pieces) - 1 != len(images) or num_wrapped != len(images):
            raise ImagePromptError(
                f"{len(pieces) - 1} {IMAGE_PAD} placeholders in the prompt ({num_wrapped} as the chat template "
                f"writes them) but {len(images)} images"
            )
        expanded = [pieces[0]]
        for image, piece in zip(images, pieces[1:], strict=True):
            t, h, w = self.token_grid(image)
            expanded += [IMAGE_PAD * (t * h * w), piece]
        return "".join(expanded)

    def spans(self, token_ids: Sequence[int], images: Sequence[Image]) -> list[PromptImage]:
        """Each image with its span (its run of `<|image_pad|>` tokens) and token grid, in order."""
        grids = [self.token_grid(image) for image in images]
        counts = [t * h * w for t, h, w in grids]
        spans = []
        for image, grid, count, (first, last) in zip(
            images, grids, counts, image_token_bounds(token_ids, self.image_token_id, counts), strict=True
        ):
            if last - first + 1 != count:
                raise ImagePromptError(f"the image tokens at {first} are not one run of {count}")
            spans.append(PromptImage(image, first, count, grid))
        return spans

    def tiles(self, image: Image) -> PatchedImage:
        """The image's patches for the engine, made only where its encoder cache lacks the image."""
        return PatchedImage(image, self.processor)


@dataclass(frozen=True)
class PatchedImage:
    """An image's flattened patches as a `PixelSource` (engine/image_input.py): the encoded image
    crosses to the engine, which resizes and patches it on an encoder-cache miss only."""

    image: Image
    processor: Qwen2VLProcessorConfig

    @property
    def grid(self) -> PatchGrid:
        """The patch grid (the tower's `grid_thw` row): the token grid times the merge size."""
        return self.processor.grid(self.image.width, self.image.height)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.grid.num_patches, self.processor.patch_dim)

    def tensor(self) -> torch.Tensor:
        """[num_patches, 3 * frames * patch * patch] float32 on the CPU."""
        return process_image(self.image.rgb(), self.processor).pixel_values
