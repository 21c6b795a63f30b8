"""A chat prompt's images for a vision model, in the API process: `image_prompt_spec` picks the
family's layout from the model's vision config. Idefics3 / SmolVLM's is here: the chat template's
`<image>` placeholders expanded per image from its size alone (`image_grid`), each image's span in
the prompt's tokens, and its tiles for the engine. Qwen2.5-VL's is `qwen2_vl_prompt.py`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvserve.chat.image import Image
from kvserve.models.vision.config import Qwen2_5VisionConfig, VisionArchConfig
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig, image_grid, process_image
from kvserve.models.vision.idefics3_prompt import expand_image_placeholders, num_image_tokens
from kvserve.models.vision.prompt_image import (
    ImagePromptError,
    ImagePromptSpec,
    PromptImage,
    image_token_bounds,
)
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig
from kvserve.models.vision.qwen2_vl_prompt import QwenVLPromptSpec

__all__ = [
    "Idefics3PromptSpec",
    "ImagePromptError",
    "ImagePromptSpec",
    "PromptImage",
    "TiledImage",
    "image_prompt_spec",
]

if TYPE_CHECKING:
    import torch


def image_prompt_spec(
    vision: VisionArchConfig | Qwen2_5VisionConfig | None,
    path: Path,
    processor: Idefics3ProcessorConfig | Qwen2VLProcessorConfig | None = None,
) -> ImagePromptSpec | None:
    """The spec of a model loaded from `path` (an HF folder; a file's folder), of the family its
    vision config names, with the image `processor` its file brings (an mmproj's), else its
    folder's; None without vision, and None (logged: the server then refuses images) when the image
    processor does not fit the encoder, since no prompt could then be laid out for it."""
    folder = path if path.is_dir() else path.parent
    try:
        if isinstance(vision, Qwen2_5VisionConfig):
            if isinstance(processor, Qwen2VLProcessorConfig):
                return QwenVLPromptSpec.from_processor(vision, processor)
            return QwenVLPromptSpec.for_model(vision, folder)
        if isinstance(processor, Idefics3ProcessorConfig) and vision is not None:
            return Idefics3PromptSpec.from_processor(vision, processor)
        return Idefics3PromptSpec.for_model(vision, folder)
    except ValueError as error:
        logger.warning("images are off: %s", error)
        return None


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Idefics3PromptSpec:
    """Idefics3 / SmolVLM's `ImagePromptSpec`: an image is tiles, each `image_seq_len` tokens."""

    image_token_id: int
    processor: Idefics3ProcessorConfig

    @staticmethod
    def for_model(vision: VisionArchConfig | None, folder: Path) -> Idefics3PromptSpec | None:
        """The spec of a model with `vision` loaded from `folder` (its processor files); None for a
        text-only model. The processor's tile and token counts must be the encoder's."""
        if vision is None:
            return None
        return Idefics3PromptSpec.from_processor(vision, Idefics3ProcessorConfig.from_folder(folder))

    @staticmethod
    def from_processor(vision: VisionArchConfig, processor: Idefics3ProcessorConfig) -> ImagePromptSpec:
        """The spec of an encoder fed by `processor`, whose tile and token counts must be its own."""
        if processor.tile_size != vision.image_size or processor.image_seq_len != vision.tokens_per_tile:
            raise ValueError(
                f"the image processor's tiles ({processor.tile_size} px, {processor.image_seq_len} tokens) "
                f"are not the vision encoder's ({vision.image_size} px, {vision.tokens_per_tile} tokens)"
            )
        return Idefics3PromptSpec(vision.image_token_id, processor)

    def expand(self, text: str, images: Sequence[Image]) -> str:
        """The rendered prompt with each image's tile markers and tokens in place of its `<image>`."""
        grids = [image_grid(image.width, image.height, self.processor) for image in images]
        try:
            return expand_image_placeholders(text, grids, self.processor.image_seq_len)
        except ValueError as error:  # e.g. an `<image>` typed as text: which image goes where is unknown
            raise ImagePromptError(str(error)) from None

    def spans(self, token_ids: Sequence[int], images: Sequence[Image]) -> list[PromptImage]:
        """Each image with its span in the tokenized prompt (the tile markers between its image
        tokens included), in prompt order."""
        seq_len = self.processor.image_seq_len
        counts = [num_image_tokens(*image_grid(i.width, i.height, self.processor), seq_len) for i in images]
        bounds = image_token_bounds(token_ids, self.image_token_id, counts)
        return [
            PromptImage(image, first, last - first + 1)
            for image, (first, last) in zip(images, bounds, strict=True)
        ]

    def tiles(self, image: Image) -> TiledImage:
        """The image's tiles for the engine, made only where its encoder cache lacks the image."""
        return TiledImage(image, self.processor)


@dataclass(frozen=True)
class TiledImage:
    """An image's tiles as a `PixelSource` (engine/image_input.py): what crosses to the engine is
    the encoded image as the client sent it (a screenshot PNG: a few hundred KB) and the processor
    settings, not up to 51 MB of float32 tiles; the engine tiles it on an encoder-cache miss only."""

    image: Image
    processor: Idefics3ProcessorConfig

    @property
    def shape(self) -> tuple[int, ...]:
        rows, cols = image_grid(self.image.width, self.image.height, self.processor)
        side = self.processor.tile_size
        return (rows * cols + 1, 3, side, side)

    def tensor(self) -> torch.Tensor:
        return process_image(self.image.rgb(), self.processor).pixel_values
