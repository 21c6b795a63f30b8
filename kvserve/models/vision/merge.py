"""Image rows into a decoder's input embeddings: each image-placeholder token of the prompt takes
the next row of the encoder's output, in prompt order (transformers' `inputs_merger`)."""

from __future__ import annotations

import torch


class ImageTokenMismatchError(ValueError):
    """The prompt's image placeholders and the image rows given for them differ in number."""


def scatter_image_rows(
    input_ids: torch.Tensor,
    text_embeds: torch.Tensor,
    image_rows: torch.Tensor,
    image_token_id: int,
    is_image: torch.Tensor | None = None,
) -> torch.Tensor:
    """input_ids [num_tokens], text_embeds [num_tokens, hidden], image_rows [num_image_tokens, hidden]
    -> [num_tokens, hidden]: the text embeddings with the i-th placeholder replaced by row i.

    A chunk of a prompt passes the rows of the placeholders inside it, so an image may be split
    across prefill chunks (Idefics3's decoder attends causally within an image too). `is_image`
    [num_tokens] bool names the placeholders where not every image token is one: the engine's batch
    may hold another request's image token typed as text, which keeps its own embedding."""
    if is_image is None:
        is_image = input_ids == image_token_id  # [num_tokens]
    num_placeholders = int(is_image.sum())
    if num_placeholders != image_rows.shape[0]:
        raise ImageTokenMismatchError(
            f"{num_placeholders} image tokens in the prompt but {image_rows.shape[0]} image rows"
        )
    return text_embeds.masked_scatter(is_image[:, None], image_rows.to(text_embeds.dtype))
