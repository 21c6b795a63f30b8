"""`view_image`: shows the model an image file of the workspace, offered only when the server says
the model takes images (`/v1/models` `modalities.vision`). The file is checked as the server checks a
request's image (kvserve/chat/image.py), so a result the model gets is never a 400 at the next turn."""

from __future__ import annotations

import base64
import io

from PIL import Image as PILImage

from kvserve.agent.tools.base import Args, ImageResult, Tool, ToolContext, schema, string
from kvserve.agent.tools.files import check_regular_file
from kvserve.agent.workspace import ToolError
from kvserve.chat.image import FORMATS, ImageError, decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS

MAX_IMAGE_BYTES = 20 << 20  # 27 MB as base64: well inside the server's 64 MB request body
MEDIA_TYPES = {pil_format: media_type for media_type, pil_format in FORMATS.items()}


class ImageViewer:
    def __init__(self, ctx: ToolContext):
        self.ctx = ctx

    def view(self, args: Args) -> ImageResult:
        shown = args.text("path")
        path = self.ctx.workspace.resolve(shown)
        check_regular_file(path, shown)
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise ToolError(f"{shown}: {size} bytes; images over {MAX_IMAGE_BYTES >> 20} MB are refused")
        data = path.read_bytes()
        media_type = _media_type(data, shown)
        try:
            image = decode_image(data, media_type, DEFAULT_LIMITS)
        except ImageError as error:
            raise ToolError(f"{shown}: {error}") from None
        text = f"{self.ctx.workspace.display(path)}: {media_type}, {image.width}x{image.height} pixels"
        return ImageResult(text, f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}")


def _media_type(data: bytes, shown: str) -> str:
    """From the bytes, not the name: Pillow reads the header, trying only the accepted formats."""
    try:
        with PILImage.open(io.BytesIO(data), formats=tuple(MEDIA_TYPES)) as opened:
            return MEDIA_TYPES[opened.format]
    except PILImage.UnidentifiedImageError:
        raise ToolError(f"{shown}: not a PNG, JPEG, WebP or GIF image") from None
    except Exception as error:  # noqa: BLE001 (Pillow raises many types on a broken header)
        raise ToolError(f"{shown}: the image could not be read: {error}") from None


def image_tools(ctx: ToolContext) -> list[Tool]:
    viewer = ImageViewer(ctx)
    return [
        Tool(
            "view_image",
            f"Look at an image file (PNG, JPEG, WebP or GIF, at most {MAX_IMAGE_BYTES >> 20} MB): "
            "the image itself is shown to you, with its size.",
            schema({"path": string("image file path, relative to the working directory")}, ("path",)),
            viewer.view,
            summary_field="path",
        )
    ]
