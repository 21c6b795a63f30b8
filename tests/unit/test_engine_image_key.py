"""engine_image_key (models/vision/prompt_image.py): what names an image for the engine's encoder
cache, KV block hashes and disk tier is its pixels and the processor settings that made its input."""

from __future__ import annotations

import dataclasses

from kvserve.chat.image import decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.models.vision.prompt_image import engine_image_key
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig
from kvserve.models.vision.qwen2_vl_prompt import QwenVLPromptSpec
from tests.image_samples import png


def test_the_key_names_the_pixels_and_the_processor_settings() -> None:
    image = decode_image(png(32, 24), "image/png", DEFAULT_LIMITS)
    again = decode_image(png(32, 24), "image/png", DEFAULT_LIMITS)
    other = decode_image(png(24, 32), "image/png", DEFAULT_LIMITS)
    spec = QwenVLPromptSpec(151655, Qwen2VLProcessorConfig())
    smaller = QwenVLPromptSpec(
        151655, dataclasses.replace(Qwen2VLProcessorConfig(), max_pixels=256 * 28 * 28)
    )
    key = engine_image_key(image, spec)
    assert engine_image_key(again, spec) == key  # stable for the same pixels and settings
    assert engine_image_key(again, QwenVLPromptSpec(151655, Qwen2VLProcessorConfig())) == key
    assert engine_image_key(other, spec) != key
    assert engine_image_key(image, smaller) != key  # same picture, other processor input
    assert len(key) == len(image.content_hash)
