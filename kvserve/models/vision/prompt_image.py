"""What the front end lays out of a vision model's prompt, whatever the family: each image's span in
the prompt's tokens (`PromptImage`), the interface a family's layout offers (`ImagePromptSpec`) and
its one error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from kvserve.chat.image import Image
from kvserve.models.vision.pixel_source import PixelSource


class ImagePromptError(ValueError):
    """The prompt and its images do not fit together (the API answers it as a 400)."""


@dataclass(frozen=True)
class PromptImage:
    """An image and its span in the prompt's tokens: from its first image token through its last
    (engine.image_input.ImageInput's offset and num_tokens)."""

    image: Image
    offset: int
    num_tokens: int
    grid: tuple[int, int, int] | None = None  # ImageInput.grid: (t, h, w) token layout for M-RoPE


class ImagePromptSpec(Protocol):
    """What the front end needs of a vision model to lay out its prompts (picklable: it crosses to
    the API process)."""

    @property
    def image_token_id(self) -> int:
        """The placeholder token each encoder row replaces."""
        ...

    def expand(self, text: str, images: Sequence[Image]) -> str:
        """The rendered prompt with each image's placeholder the template wrote expanded into the
        image's tokens, from its size alone; ImagePromptError where they do not match."""
        ...

    def spans(self, token_ids: Sequence[int], images: Sequence[Image]) -> list[PromptImage]:
        """Each image with its span in the tokenized prompt, in prompt order; ImagePromptError where
        the tokens do not hold the images' tokens."""
        ...

    def tiles(self, image: Image) -> PixelSource:
        """The image's pixels for the engine, made only where its encoder cache lacks the image."""
        ...


def image_token_bounds(
    token_ids: Sequence[int], image_token_id: int, counts: Sequence[int]
) -> list[tuple[int, int]]:
    """(first, last) index of each image's image tokens, the i-th image taking the next `counts[i]`
    of them; ImagePromptError where the prompt holds another number."""
    positions = [i for i, token in enumerate(token_ids) if token == image_token_id]
    if sum(counts) != len(positions):
        raise ImagePromptError(
            f"the prompt has {len(positions)} image tokens where its {len(counts)} images need {sum(counts)}"
        )
    bounds, start = [], 0
    for count in counts:
        bounds.append((positions[start], positions[start + count - 1]))
        start += count
    return bounds


def engine_image_key(image: Image, spec: ImagePromptSpec) -> str:
    """What names an image for the engine (its encoder cache, the KV blocks its tokens touch, the
    disk tier): its pixels and how they become encoder input. The processor's settings are part
    of it, so that the same picture under other settings (a new `max_pixels` or tile size in the
    model folder, another mmproj) never reuses rows or KV made under the old ones, across restarts
    too. Specs are frozen dataclasses, whose repr is stable."""
    return xxhash.xxh3_128(f"{image.content_hash}:{spec!r}".encode()).hexdigest()
