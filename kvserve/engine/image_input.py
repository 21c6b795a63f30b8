"""ImageInput: one image of a request, as the engine takes it.

Its pixels come from a `PixelSource`: a tensor of tiles given directly, or (what the front end
sends: models/vision/image_prompt.py's `TiledImage`) the encoded image and the processor settings,
tiled only when the encoder cache lacks the image. The tile count is known without the pixels.

Torch-free at import, like `request.py`: the API process's `EngineClient` types name it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvserve.models.vision.pixel_source import PixelSource

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorPixels:
    """Tiles already made."""

    pixels: torch.Tensor = field(repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.pixels.shape)

    def tensor(self) -> torch.Tensor:
        return self.pixels

    def __reduce__(self) -> tuple[Any, ...]:
        # NOTE: across the engine process's pipe the pixels go as a numpy array, which pickles in
        # half the time of a tensor (~40 ms against ~70 for SmolVLM's 17 tiles of 512 px, 51 MB:
        # torch pickles a tensor's storage through torch.save) and comes back without a copy.
        return (_rebuild, (self.pixels.numpy(),))


def _rebuild(pixels: Any) -> TensorPixels:
    import torch

    return TensorPixels(torch.from_numpy(pixels))


@dataclass(frozen=True, eq=False)
class ImageInput:
    """An image whose encoder rows replace placeholder tokens of the prompt.

    `num_tokens` counts the prompt tokens the image spans, from its first placeholder through its
    last: where a family puts markers between an image's tiles (Idefics3's `<row_1_col_2>`), they lie
    inside the span and keep their own embeddings; the span's placeholders take the image's rows in
    order, and there must be exactly as many as the pixels give rows. Everything the KV of those
    tokens depends on must be named by `content_hash`: it keys the encoder cache and enters the
    chain hash of every KV block the span touches (kv_cache/block_hash.py), in RAM and on disk."""

    content_hash: str
    offset: int  # index in the prompt of the image's first placeholder token
    num_tokens: int
    # The tiles: a PixelSource, or a tensor [num_tiles, channels, side, side] (float32, CPU).
    pixels: PixelSource | torch.Tensor = field(repr=False)
    # (t, h, w): how the image's tokens lie in position space, for families whose positions are not
    # the token index (Qwen2.5-VL's M-RoPE: t*h*w tokens, after the encoder's patch merging); None
    # where an image's tokens take ordinary positions (Idefics3).
    grid: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if not hasattr(self.pixels, "tensor"):  # a tensor given directly
            if not self.pixels.is_floating_point():  # type: ignore[union-attr]
                raise ValueError(f"pixel values must be floats, not {self.pixels.dtype}")  # type: ignore[union-attr]
            object.__setattr__(self, "pixels", TensorPixels(self.pixels))  # type: ignore[arg-type]

    @property
    def end(self) -> int:
        """One past the span's last token."""
        return self.offset + self.num_tokens

    def overlaps(self, start: int, end: int) -> bool:
        return self.offset < end and start < self.end

    @property
    def pixel_shape(self) -> tuple[int, ...]:
        return self.pixels.shape  # type: ignore[union-attr]

    @property
    def pixel_values(self) -> torch.Tensor:
        return self.pixels.tensor()  # type: ignore[union-attr]


def check_images(
    prompt_token_ids: Sequence[int],
    images: Sequence[ImageInput],
    image_token_id: int,
    # pixels' shape and grid -> their encoder rows; ValueError if unusable
    rows_of: Callable[[tuple[int, ...], tuple[int, int, int] | None], int],
) -> None:
    """Raise ValueError unless every image's span lies in the prompt, in order, without overlap,
    starts and ends on a placeholder and holds as many placeholders as its pixels give rows."""
    previous_end = 0
    for image in images:
        if image.num_tokens <= 0 or image.offset < previous_end or image.end > len(prompt_token_ids):
            raise ValueError(
                f"image spans must be non-empty, in prompt order and inside the prompt "
                f"(span [{image.offset}, {image.end}) of a {len(prompt_token_ids)}-token prompt)"
            )
        previous_end = image.end
        span = prompt_token_ids[image.offset : image.end]
        if span[0] != image_token_id or span[-1] != image_token_id:
            raise ValueError(f"the image span at {image.offset} must start and end on an image token")
        num_rows = rows_of(image.pixel_shape, image.grid)
        num_placeholders = list(span).count(image_token_id)
        if num_placeholders != num_rows:
            raise ValueError(
                f"the image at {image.offset} spans {num_placeholders} image tokens but its pixels give "
                f"{num_rows} rows"
            )
