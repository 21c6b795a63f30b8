"""The images of one request, decoded as the adapters meet them and counted against the limit."""

from __future__ import annotations

from collections.abc import Callable

from kvserve.api.errors import ApiError
from kvserve.chat.conversation import ImagePart
from kvserve.chat.image import Image, ImageError, decode_base64, decode_data_uri
from kvserve.chat.image_limits import ImageLimits


class ImageReader:
    """One per request: the count spans every message (tool results included). Each mistake is
    a 400 naming the wire field, so the client can tell which of its images was refused."""

    def __init__(self, limits: ImageLimits):
        self.limits = limits
        self.num_images = 0

    def from_url(self, url: str, param: str) -> ImagePart:
        """Chat `image_url.url`, Responses `image_url`: a data: URI (URLs are not fetched)."""
        return self._decode(lambda: decode_data_uri(url, self.limits), param)

    def from_base64(self, data: str, media_type: str, param: str) -> ImagePart:
        """Anthropic's `{"type": "base64", "media_type", "data"}` source."""
        return self._decode(lambda: decode_base64(data, media_type, self.limits), param)

    def _decode(self, decode: Callable[[], Image], param: str) -> ImagePart:
        self._count(param)
        try:
            return ImagePart(decode())
        except ImageError as error:
            raise ApiError(400, f"{param}: {error}", param=param) from error

    def _count(self, param: str) -> None:
        self.num_images += 1
        if self.num_images > self.limits.max_images_per_request:
            raise ApiError(
                400,
                f"{param}: too many images; at most {self.limits.max_images_per_request} per request",
                param=param,
            )
