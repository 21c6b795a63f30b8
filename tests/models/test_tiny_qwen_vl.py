"""The tiny Qwen2.5-VL folder (tests/models/tiny_qwen_vl.py) against transformers: it loads there, our
processor and tower read its files and give `model.visual`'s rows for the HF processor's patches,
and `ChatService` lays out a chat with images as transformers' template and processor do."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from kvserve.chat.conversation import ChatRequest, ImagePart, Message, TextPart
from kvserve.chat.image import Image, decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.models.loader.safetensors import iter_safetensors
from kvserve.models.loader.tokenizer import load_hf_tokenizer
from kvserve.models.vision.config import qwen2_5_vl_vision_from_hf
from kvserve.models.vision.image_prompt import image_prompt_spec
from kvserve.models.vision.qwen2_5_vl_vision import Qwen2_5VisionTransformer, strip_vision_prefix
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig, process_image
from kvserve.models.vision.qwen2_vl_prompt import QwenVLPromptSpec
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, reply
from tests.models.tiny_qwen_vl import hf_qwen_processor, save_tiny_qwen_vl

# (width, height): 4 x 4 tokens in 2 x 2 windows; below min_pixels; over max_pixels, and odd.
SIZES = [(32, 32), (5, 9), (97, 61)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen_vl(tmp_path_factory.mktemp("qwen_vl"))


@pytest.fixture(scope="module")
def hf(folder: Path) -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _picture(width: int, height: int, seed: int) -> PILImage.Image:
    return PILImage.fromarray(
        np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    )


def _encoded(picture: PILImage.Image) -> Image:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return decode_image(buffer.getvalue(), "image/png", DEFAULT_LIMITS)


def _tower(folder: Path) -> Qwen2_5VisionTransformer:
    """Our tower with the folder's weights, loaded by the names a family class maps."""
    config = qwen2_5_vl_vision_from_hf(json.loads((folder / "config.json").read_text()))
    tower = Qwen2_5VisionTransformer(config).eval()
    weights = {}
    for hf_name, tensor in iter_safetensors(folder):
        name = strip_vision_prefix(hf_name)
        if name is not None:
            weights[name.removeprefix("visual.")] = tensor
    tower.load_state_dict(weights, strict=True)
    return tower


def test_folder_loads_in_transformers_with_the_added_tokens(folder: Path, hf: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.convert_tokens_to_ids
    config = hf.config
    assert (config.image_token_id, config.vision_start_token_id, config.vision_end_token_id) == (
        ids("<|image_pad|>"), ids("<|vision_start|>"), ids("<|vision_end|>"),
    )  # fmt: skip
    assert config.text_config.vocab_size == len(tokenizer) and config.vision_config.fullatt_block_indexes == [
        1
    ]
    vision = qwen2_5_vl_vision_from_hf(json.loads((folder / "config.json").read_text()))
    assert vision.image_token_id == config.image_token_id and vision.merger_window == 2


def test_processor_and_tower_give_transformers_rows(folder: Path, hf: Any) -> None:
    """All the sizes in one call, as the engine batches an encoder-cache miss."""
    from transformers import AutoImageProcessor

    pictures = [_picture(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    hf_inputs = AutoImageProcessor.from_pretrained(folder)(images=pictures, return_tensors="pt")
    config = Qwen2VLProcessorConfig.from_folder(folder)
    processed = [process_image(p, config) for p in pictures]
    pixels = torch.cat([p.pixel_values for p in processed])
    grid_thw = torch.tensor([list(p.grid) for p in processed])
    assert torch.equal(pixels, hf_inputs["pixel_values"]) and torch.equal(
        grid_thw, hf_inputs["image_grid_thw"]
    )
    assert any(h // 2 > 2 or w // 2 > 2 for _, h, w in grid_thw.tolist())  # more than one window
    with torch.no_grad():
        expected = hf.model.get_image_features(pixels, image_grid_thw=grid_thw).pooler_output
        got = _tower(folder)(pixels, grid_thw)
    torch.testing.assert_close(got, torch.cat(expected), atol=1e-5, rtol=0)


def test_chat_service_lays_out_images_as_transformers(folder: Path) -> None:
    """Our template rendering, expansion and spans against transformers' chat template and
    processor on the same folder; the engine's inputs carry each image's token grid."""
    from transformers import AutoImageProcessor, AutoTokenizer

    spec = image_prompt_spec(
        qwen2_5_vl_vision_from_hf(json.loads((folder / "config.json").read_text())), folder
    )
    assert isinstance(spec, QwenVLPromptSpec)
    settings = ChatServiceSettings(
        model_name="tiny", max_model_len=4096, supports_images=True, image_prompt=spec
    )
    service = ChatService(FakeEngine(reply("ok")), load_hf_tokenizer(folder), settings)
    pictures = [_picture(32, 32, seed=1), _picture(97, 61, seed=2)]
    images = [_encoded(p) for p in pictures]
    request = ChatRequest(
        messages=(
            Message(
                "user", (ImagePart(images[0]), TextPart("and"), ImagePart(images[1]), TextPart("differ how?"))
            ),
        )
    )
    prepared = service.prepare_chat(request)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    parts = [
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
        {"type": "text", "text": "differ how?"},
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    processor = hf_qwen_processor(AutoImageProcessor.from_pretrained(folder), tokenizer)
    expected = processor(text=[text], images=pictures)
    assert list(prepared.prompt_token_ids) == expected["input_ids"][0]
    grids = [(t, h // 2, w // 2) for t, h, w in expected["image_grid_thw"].tolist()]
    assert [p.grid for p in prepared.images] == grids
    is_image = np.array(expected["mm_token_type_ids"][0]) == 1
    spans = [(p.offset, p.offset + p.num_tokens) for p in prepared.images]
    assert [i for a, b in spans for i in range(a, b)] == np.flatnonzero(is_image).tolist()

    inputs = service._image_inputs(prepared)
    assert [i.grid for i in inputs] == grids
    assert [i.pixel_shape for i in inputs] == [(t * h * w * 4, 3 * 2 * 4 * 4) for t, h, w in grids]
