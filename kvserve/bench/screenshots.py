"""Deterministic synthetic screenshots for the vision benchmarks (`bench multiturn --image-turns`,
scripts/vision_bench.py): PNGs of text and coloured bars, which compress as real screenshots do."""

from __future__ import annotations

import base64
import io

PNG_MEDIA_TYPE = "image/png"


def screenshot(seed: int, size: tuple[int, int] = (1920, 1080)) -> bytes:
    """A `size` (width, height) PNG with text and coloured bars; the same seed gives the same bytes."""
    from PIL import Image, ImageDraw  # lazy: `kvserve bench` without images never needs it

    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for i in range(40):
        colour = ((seed * 37 + i * 6) % 256, 120, 255 - i * 6)
        draw.rectangle((i * 40, i * 25, i * 40 + 400, i * 25 + 20), fill=colour)
        draw.text(
            (i * 40 + 10, i * 25 + 5), f"{seed}:{i} def handler(event): return event.body", fill="black"
        )
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def base64_png(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")
