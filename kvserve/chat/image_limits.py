"""What a request's images may be (`kvserve serve --max-images-per-request/--max-image-pixels`).

Apart from chat/image.py so the CLI's parser gets the defaults without importing Pillow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageLimits:
    max_images_per_request: int = 16  # tool results included
    # Checked on the header, before any pixel is decoded. Pillow's own bomb guard refuses more
    # than 2 * PIL.Image.MAX_IMAGE_PIXELS (~179M) whatever this says.
    max_image_pixels: int = 40_000_000


DEFAULT_LIMITS = ImageLimits()
