"""ImageEmbedder: a step's image rows, put at its placeholder tokens as the model's `inputs_embeds`.

A prefill chunk [start, end) takes the rows of the placeholders inside it, so a chunk may cut an
image (the scheduler keeps images whole only for families that need it). The images a step needs
and the encoder cache lacks are encoded together, one `encode_images` call per pixel shape.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.runner.encoder_cache import EncoderCache
from kvserve.models.vision.interface import ImageInputModel


class _Slice(NamedTuple):
    """Rows [first_row, first_row + len(positions)) of `image` go to these rows of the flat batch."""

    image: ImageInput
    first_row: int
    positions: np.ndarray  # int64


class ImageEmbedder:
    def __init__(self, model: ImageInputModel, cache: EncoderCache, device: torch.device) -> None:
        self.model = model
        self.cache = cache
        self.device = device

    def touches(self, scheduled: list[ScheduledRequest]) -> bool:
        """Some chunk of the step holds an image token (so the step needs `inputs_embeds`)."""
        return any(
            image.overlaps(s.start, s.start + s.num_new_tokens)
            for s in scheduled
            for image in s.request.images
        )

    def inputs_embeds(
        self, scheduled: list[ScheduledRequest], input_ids: torch.Tensor, query_start_loc: list[int]
    ) -> torch.Tensor | None:
        """[num_tokens, hidden] embeddings of the step's flat `input_ids` with the image rows in place,
        or None when no chunk holds an image token (the step then runs on ids, as text does)."""
        slices = self._slices(scheduled, query_start_loc)
        if not slices:
            return None
        rows = self._rows([s.image for s in slices])
        is_image = np.zeros(input_ids.shape[0], dtype=bool)
        parts = []
        for image, first_row, positions in slices:
            is_image[positions] = True
            parts.append(rows[image.content_hash][first_row : first_row + len(positions)])
        mask = torch.from_numpy(is_image).to(self.device)
        return self.model.embed_inputs(input_ids, torch.cat(parts), mask)

    def _slices(self, scheduled: list[ScheduledRequest], query_start_loc: list[int]) -> list[_Slice]:
        """The image rows each chunk takes, in flat batch order."""
        token = self.model.image_token_id
        slices = []
        for index, s in enumerate(scheduled):
            start, end = s.start, s.start + s.num_new_tokens
            prompt = s.request.prompt_token_ids
            for image in s.request.images:
                if not image.overlaps(start, end):
                    continue
                lo, hi = max(start, image.offset), min(end, image.end)
                # Placeholders only: markers between an image's tiles lie in its span as text.
                placeholders = np.flatnonzero(np.asarray(prompt[lo:hi]) == token)
                first_row = prompt[image.offset : lo].count(token)
                slices.append(_Slice(image, first_row, placeholders + (query_start_loc[index] + lo - start)))
        return slices

    def _rows(self, images: list[ImageInput]) -> dict[str, torch.Tensor]:
        """Content hash -> rows [num_rows, hidden] of every image given: from the cache, or encoded
        in one batch per pixel shape (tiles of one size; patches of one size) and then cached."""
        rows: dict[str, torch.Tensor] = {}
        missing: dict[tuple[int, ...], list[ImageInput]] = {}  # pixel shape but the first -> images
        for image in {image.content_hash: image for image in images}.values():
            cached = self.cache.get(image.content_hash, self._num_rows(image))
            if cached is None:
                missing.setdefault(image.pixel_shape[1:], []).append(image)
            else:
                rows[image.content_hash] = cached
        for group in missing.values():
            pixels = torch.cat([image.pixel_values for image in group]).to(self.device)
            encoded = self.model.encode_images(pixels, [image.grid for image in group])
            encoded = encoded.reshape(-1, encoded.shape[-1])  # [total_rows, hidden]
            for image, image_rows in zip(
                group, encoded.split([self._num_rows(i) for i in group]), strict=True
            ):
                rows[image.content_hash] = image_rows
                self.cache.put(image.content_hash, image_rows)
        return rows

    def _num_rows(self, image: ImageInput) -> int:
        return self.model.count_image_rows(image.pixel_shape, image.grid)
