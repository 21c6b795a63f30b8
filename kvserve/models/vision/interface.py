"""`ImageInputModel`: what a decoder that takes images offers the engine, whatever its family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ImageInputModel(Protocol):
    # True where an image's tokens attend to each other both ways (e.g. Gemma 3): a prefill chunk
    # must then hold an image whole. Idefics3 attends causally inside an image, so chunks may cut it.
    image_spans_bidirectional: bool

    @property
    def image_token_id(self) -> int:
        """The placeholder token each image row replaces."""
        ...

    def count_image_rows(self, shape: tuple[int, ...], grid: tuple[int, int, int] | None = None) -> int:
        """The rows `encode_images` gives pixels of this shape (and token grid, for families that
        lay an image's tokens out on one: ImageInput.grid); ValueError for pixels it cannot encode."""
        ...

    def encode_images(
        self, pixel_values: torch.Tensor, grids: Sequence[tuple[int, int, int] | None] = ()
    ) -> torch.Tensor:
        """Several images' pixels, concatenated along the first dimension (with each image's grid,
        for families that take one) -> their rows, in order: [total_rows, hidden_size], or
        [num_tiles, rows_per_tile, hidden_size] for a family that encodes square tiles."""
        ...

    def embed_inputs(
        self, input_ids: torch.Tensor, image_rows: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[num_tokens] ids and image rows -> inputs_embeds [num_tokens, hidden_size] for `forward`."""
        ...
