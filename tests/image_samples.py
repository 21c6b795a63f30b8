"""Images made with Pillow for the image tests: every format the server accepts, and broken ones."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def picture(width: int = 32, height: int = 24, mode: str = "RGB") -> Image.Image:
    """A gradient, so encoders cannot collapse it to one colour and a crop or shift changes it."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [((x * 8) % 256, (y * 8) % 256, (x + y) % 256) for y in range(height) for x in range(width)]
    )
    return image.convert(mode)


def encoded(image: Image.Image, pil_format: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, pil_format, **options)
    return buffer.getvalue()


def png(width: int = 32, height: int = 24) -> bytes:
    return encoded(picture(width, height), "PNG")


def two_frame_gif() -> bytes:
    first, second = picture(), picture().rotate(180)
    return encoded(first, "GIF", save_all=True, append_images=[second], duration=100, loop=0)


def png_header(width: int, height: int) -> bytes:
    """A well-formed PNG whose header claims `width` x `height` but holds only a few bytes of pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
