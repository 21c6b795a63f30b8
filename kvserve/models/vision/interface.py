"""`ImageInputModel`: what a decoder that takes images offers the engine, whatever its family."""

from __future__ import annotations

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

    def count_image_rows(self, shape: tuple[int, ...]) -> int:
        """The rows `encode_images` gives tiles of this shape; ValueError for tiles it cannot encode."""
        ...

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[num_tiles, channels, side, side] -> [num_tiles, rows_per_tile, hidden_size]."""
        ...

    def embed_inputs(
        self, input_ids: torch.Tensor, image_rows: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[num_tokens] ids and image rows -> inputs_embeds [num_tokens, hidden_size] for `forward`."""
        ...
