"""Image decoding and limits (chat/image.py): every accepted format, and every way an image is refused."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from PIL import Image as PILImage

from kvserve.chat.image import ImageError, decode_data_uri, decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS, ImageLimits
from tests.image_samples import data_uri, encoded, picture, png, png_header, two_frame_gif

LOSSLESS = [
    ("image/png", encoded(picture(), "PNG")),
    ("image/webp", encoded(picture(), "WEBP", lossless=True)),
    ("image/png", encoded(picture(), "PNG", compress_level=1)),
]


@pytest.mark.parametrize(("media_type", "data"), LOSSLESS)
def test_lossless_encodings_of_one_picture_share_the_pixel_hash(media_type: str, data: bytes) -> None:
    image = decode_image(data, media_type, DEFAULT_LIMITS)
    reference = decode_image(png(), "image/png", DEFAULT_LIMITS)
    assert (image.width, image.height) == (32, 24)
    assert image.content_hash == reference.content_hash
    assert image.data == data and image.media_type == media_type
    assert image.rgb().tobytes() == picture().tobytes()


def test_jpeg_decodes_to_its_own_pixels() -> None:
    data = encoded(picture(), "JPEG", quality=90)
    image = decode_image(data, "image/jpeg", DEFAULT_LIMITS)
    assert (image.width, image.height, image.media_type) == (32, 24, "image/jpeg")
    assert image.content_hash != decode_image(png(), "image/png", DEFAULT_LIMITS).content_hash
    assert decode_image(data, "image/jpg", DEFAULT_LIMITS).content_hash == image.content_hash


def test_a_changed_pixel_changes_the_hash() -> None:
    changed = picture()
    changed.putpixel((5, 5), (1, 2, 3))
    assert (
        decode_image(encoded(changed, "PNG"), "image/png", DEFAULT_LIMITS).content_hash
        != decode_image(png(), "image/png", DEFAULT_LIMITS).content_hash
    )


def test_gif_is_its_first_frame() -> None:
    image = decode_image(two_frame_gif(), "image/gif", DEFAULT_LIMITS)
    first = encoded(picture(), "GIF")  # the same palette quantisation as frame 0
    assert image.content_hash == decode_image(first, "image/gif", DEFAULT_LIMITS).content_hash
    assert image.rgb().size == (32, 24)


def test_transparency_is_composited_onto_white() -> None:
    clear = PILImage.new("RGBA", (4, 4), (255, 0, 0, 0))
    image = decode_image(encoded(clear, "PNG"), "image/png", DEFAULT_LIMITS)
    assert image.rgb().getcolors() == [(16, (255, 255, 255))]


def test_data_uri() -> None:
    image = decode_data_uri(data_uri(png()), DEFAULT_LIMITS)
    assert image.content_hash == decode_image(png(), "image/png", DEFAULT_LIMITS).content_hash
    wrapped = data_uri(png())
    wrapped = wrapped[:40] + "\n" + wrapped[40:]  # MIME-style line breaks in the base64
    assert decode_data_uri(wrapped, DEFAULT_LIMITS) == image


@pytest.mark.parametrize(
    ("media_type", "data", "message"),
    [
        ("image/png", png()[: len(png()) // 2], "could not be decoded"),
        ("image/jpeg", encoded(picture(), "JPEG")[:200], "could not be decoded"),
        ("image/png", b"", "empty"),
        ("image/png", b"hello, world", "not a PNG"),
        ("image/jpeg", png(), "media type is image/jpeg but its data is PNG"),
        ("image/gif", encoded(picture(), "WEBP"), "media type is image/gif but its data is WEBP"),
        ("text/plain", png(), "unsupported image media type"),
        ("image/svg+xml", b"<svg/>", "unsupported image media type"),
        ("image/bmp", encoded(picture(), "BMP"), "unsupported image media type"),
        ("image/png", png_header(30000, 30000), "too many pixels"),
        ("image/png", png_header(8000, 8000), "8000x8000 = 64000000 pixels"),
    ],
)
def test_refused(media_type: str, data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        decode_image(data, media_type, DEFAULT_LIMITS)


def test_a_huge_header_is_refused_without_allocating_its_pixels() -> None:
    tracemalloc.start()
    start = time.perf_counter()
    for size in (30000, 7000):
        with pytest.raises(ImageError):
            decode_image(png_header(size, size), "image/png", DEFAULT_LIMITS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20 and time.perf_counter() - start < 1.0


def test_pixel_limit_is_a_setting() -> None:
    limits = ImageLimits(max_image_pixels=32 * 24 - 1)
    with pytest.raises(ImageError, match="at most 767"):
        decode_image(png(), "image/png", limits)
    assert decode_image(png(), "image/png", ImageLimits(max_image_pixels=32 * 24)).width == 32


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("https://example.com/cat.png", "does not fetch URLs or read files"),
        ("file:///etc/passwd", "does not fetch URLs or read files"),
        ("/home/me/shot.png", "does not fetch URLs or read files"),
        ("data:image/png;base64,not*base64!", "base64 data is invalid"),
        ("data:image/png;base64,AAAAA", "base64 data is invalid"),
        ("data:image/png,rawbytes", "must be base64-encoded"),
        ("data:image/png;base64", "must be base64-encoded"),
        ("data:image/png;base64,", "empty"),
    ],
)
def test_refused_uris(uri: str, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        decode_data_uri(uri, DEFAULT_LIMITS)
