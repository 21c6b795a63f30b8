"""Images in the canonical conversation: `data:` URIs decoded and validated once, at the edge.

An `Image` keeps the encoded bytes as sent, not the pixels: a 40-megapixel RGB image is 120 MB, a
screenshot PNG a few hundred KB, and a vision encoder whose output cache already holds the image
(keyed by `content_hash`) never needs the pixels again. `rgb()` decodes them when the model does.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from dataclasses import dataclass

import xxhash
from PIL import Image as PILImage
from PIL import ImageOps

from kvserve.chat.image_limits import ImageLimits

logger = logging.getLogger(__name__)

# Media type -> Pillow format. Pillow is told to try only these: some of its other parsers
# (EPS runs Ghostscript) must never see client bytes.
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
_ALIASES = {"image/jpg": "image/jpeg"}
_WHITESPACE = str.maketrans("", "", " \t\r\n")


class ImageError(ValueError):
    """A client's image is unusable; the message says why (the API answers it as a 400)."""


@dataclass(frozen=True, eq=False)
class Image:
    """A validated image. `content_hash` is of the decoded RGB pixels (and size), so the same
    picture re-encoded (PNG vs lossless WebP, other compression) gets the same key."""

    media_type: str  # one of FORMATS
    width: int
    height: int
    data: bytes  # the encoded bytes as the client sent them
    content_hash: str  # xxh3-128 hex of the RGB pixels rgb() returns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and other.content_hash == self.content_hash

    def __hash__(self) -> int:
        return hash(self.content_hash)

    def rgb(self) -> PILImage.Image:
        """The pixels the model sees (what `content_hash` describes): first frame, EXIF-rotated,
        transparency composited onto white as transformers' `convert_to_rgb` does."""
        return _to_rgb(_open(self.data, FORMATS[self.media_type]))


def decode_data_uri(uri: str, limits: ImageLimits) -> Image:
    """A `data:image/...;base64,...` URI -> Image, or ImageError."""
    media_type, payload = _split_data_uri(uri)
    return decode_base64(payload, media_type, limits)


def decode_base64(payload: str, media_type: str, limits: ImageLimits) -> Image:
    try:
        data = base64.b64decode(payload.translate(_WHITESPACE), validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImageError(f"the image's base64 data is invalid ({error})") from error
    return decode_image(data, media_type, limits)


def decode_image(data: bytes, media_type: str, limits: ImageLimits) -> Image:
    media_type = _ALIASES.get(media_type.lower(), media_type.lower())
    if media_type not in FORMATS:
        raise ImageError(f"unsupported image media type {media_type!r}; accepted: {', '.join(FORMATS)}")
    if not data:
        raise ImageError("the image is empty (zero bytes)")
    try:
        opened = _open(data, None)
        _check_header(opened, media_type, limits)
        pixels = _to_rgb(opened)  # decodes everything: truncated or corrupt data fails here
    except ImageError:
        raise
    except PILImage.UnidentifiedImageError as error:
        raise ImageError(f"the data is not a {' or '.join(FORMATS.values())} image") from error
    except PILImage.DecompressionBombError as error:
        raise ImageError(f"the image has too many pixels (at most {limits.max_image_pixels})") from error
    # Pillow's decoders raise many exception types on hostile input (OSError, SyntaxError,
    # ValueError, struct.error, ...); every one of them means the bytes are not a valid image.
    except Exception as error:
        logger.debug("image decode failed", exc_info=True)
        raise ImageError(f"the image could not be decoded: {error}") from error
    width, height = pixels.size
    return Image(media_type, width, height, data, pixel_hash(pixels))


def pixel_hash(pixels: PILImage.Image) -> str:
    assert pixels.mode == "RGB"
    hasher = xxhash.xxh3_128(f"{pixels.mode}:{pixels.width}x{pixels.height}:".encode())
    hasher.update(pixels.tobytes())
    return hasher.hexdigest()


def _split_data_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("data:"):
        raise ImageError(
            "only inline images (data: URIs with base64 data) are accepted: "
            "the server does not fetch URLs or read files"
        )
    header, comma, payload = uri[5:].partition(",")
    params = header.split(";")
    if not comma or params[-1].lower() != "base64":
        raise ImageError("the image's data: URI must be base64-encoded (data:image/png;base64,...)")
    return params[0], payload


def _open(data: bytes, pil_format: str | None) -> PILImage.Image:
    # Not closed after use: closing a Pillow image frees its pixels, and a BytesIO holds no handle.
    formats = tuple(FORMATS.values()) if pil_format is None else (pil_format,)
    return PILImage.open(io.BytesIO(data), formats=formats)


def _check_header(opened: PILImage.Image, media_type: str, limits: ImageLimits) -> None:
    """What the header says, before the pixels are decoded (Image.open reads only the header)."""
    if opened.format != FORMATS[media_type]:
        raise ImageError(f"the image's media type is {media_type} but its data is {opened.format}")
    width, height = opened.size
    if width <= 0 or height <= 0:
        raise ImageError(f"the image has zero size ({width}x{height})")
    if width * height > limits.max_image_pixels:
        raise ImageError(
            f"the image is {width}x{height} = {width * height} pixels; at most "
            f"{limits.max_image_pixels} are accepted"
        )


def _to_rgb(opened: PILImage.Image) -> PILImage.Image:
    image = opened
    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PILImage.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
