"""Qwen2.5-VL image preprocessing and prompt layout against transformers: the patches against
`Qwen2VLImageProcessorPil` (exactly equal, atol = rtol = 0; it is the class transformers 5.25 picks
without torchvision), the prompt text and ids against `Qwen2_5_VLProcessor`. Both sides read the
settings from the same model folder."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from kvserve.chat.image import Image, decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.models.vision.config import Qwen2_5VisionConfig
from kvserve.models.vision.image_prompt import ImagePromptError, image_prompt_spec
from kvserve.models.vision.qwen2_vl_processor import (
    PatchGrid,
    Qwen2VLProcessorConfig,
    process_image,
    smart_resize,
)
from kvserve.models.vision.qwen2_vl_prompt import IMAGE_PAD, QwenVLPromptSpec
from tests.models.tiny_qwen_vl import hf_qwen_processor

# Qwen2.5-VL-3B-Instruct's preprocessor_config.json.
QWEN25_VL = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
}  # fmt: skip
# transformers 5's names (`size`), a small pixel budget, bilinear, one frame, merge 1, ImageNet stats.
SMALL = {
    "size": {"shortest_edge": 16 * 16, "longest_edge": 40 * 40}, "patch_size": 4, "temporal_patch_size": 1,
    "merge_size": 1, "resample": 2, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
}  # fmt: skip
SETTINGS = {"qwen25_vl": QWEN25_VL, "small": SMALL}

# (width, height): one pixel (below min_pixels), tiny, portrait, landscape with an odd side, a
# screenshot (over max_pixels for SMALL), odd both ways, a 1:150 strip.
SIZES = [(1, 1), (20, 30), (300, 800), (801, 300), (1920, 1080), (333, 517), (3, 450)]


def _image(width: int, height: int, seed: int = 0, bands: int = 3) -> PILImage.Image:
    noise = np.random.default_rng(seed).integers(0, 256, (height, width, bands), dtype=np.uint8)
    return PILImage.fromarray(noise[..., 0] if bands == 1 else noise)


def _encoded(image: PILImage.Image) -> Image:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return decode_image(buffer.getvalue(), "image/png", DEFAULT_LIMITS)


def _folder(path: Path, settings: dict[str, Any]) -> Path:
    (path / "preprocessor_config.json").write_text(json.dumps(settings))
    return path


@pytest.fixture(scope="module", params=list(SETTINGS))
def setting(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(our config, transformers' PIL image processor), both from one folder."""
    from transformers import Qwen2VLImageProcessorPil

    folder = _folder(tmp_path_factory.mktemp(request.param), SETTINGS[request.param])
    return Qwen2VLProcessorConfig.from_folder(folder), Qwen2VLImageProcessorPil.from_pretrained(folder)


def _assert_same_as_hf(
    config: Qwen2VLProcessorConfig, hf: Any, ours: PILImage.Image, theirs: PILImage.Image
) -> None:
    processed = process_image(ours, config)
    expected = hf(images=[theirs], return_tensors="pt")
    assert [list(processed.grid)] == expected["image_grid_thw"].tolist()
    assert processed.pixel_values.dtype == torch.float32
    torch.testing.assert_close(processed.pixel_values, expected["pixel_values"], atol=0, rtol=0)


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_patches_equal_transformers(setting: tuple[Any, Any], width: int, height: int) -> None:
    config, hf = setting
    image = _image(width, height, seed=width + height)
    _assert_same_as_hf(config, hf, image, image)
    grid = config.grid(width, height)  # from the size alone
    assert process_image(image, config).pixel_values.shape == (grid.num_patches, config.patch_dim)
    assert grid.num_patches == hf.get_number_of_image_patches(height, width)


def test_settings_of_the_hub_file_and_of_transformers_5(tmp_path: Path) -> None:
    """The Hub's min/max_pixels and transformers 5's `size` read the same."""
    from transformers import Qwen2VLImageProcessorPil

    hub = Qwen2VLProcessorConfig.from_folder(_folder(tmp_path, QWEN25_VL))
    assert (hub.min_pixels, hub.max_pixels, hub.resample) == (3136, 12845056, PILImage.Resampling.BICUBIC)
    saved = tmp_path / "saved"
    Qwen2VLImageProcessorPil(**QWEN25_VL).save_pretrained(saved)
    assert Qwen2VLProcessorConfig.from_folder(saved) == hub
    assert Qwen2VLProcessorConfig.from_folder(tmp_path / "none") == Qwen2VLProcessorConfig()


@pytest.mark.parametrize(
    ("height", "width"), [(1, 1), (28, 28), (27, 29), (10000, 51), (4000, 3000), (2, 399)]
)
def test_smart_resize_is_transformers(height: int, width: int) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    for bounds in [(56 * 56, 28 * 28 * 1280), (4 * 28 * 28, 16 * 28 * 28)]:
        assert smart_resize(height, width, 28, *bounds) == hf_smart_resize(height, width, 28, *bounds)


def test_too_long_a_strip_is_refused() -> None:
    with pytest.raises(ValueError, match="aspect ratio must be at most 200"):
        smart_resize(1, 201)


def _other_modes() -> dict[str, PILImage.Image]:
    palette = _image(40, 70, seed=4).convert("P")
    transparent = palette.copy()
    transparent.info["transparency"] = 7  # one palette entry is see-through (PNG tRNS)
    return {"RGBA": _image(40, 70, seed=1, bands=4), "L": _image(40, 70, seed=3, bands=1), "P": palette,
            "P_transparency": transparent}  # fmt: skip


@pytest.mark.parametrize("mode", list(_other_modes()))
def test_other_modes_through_image_rgb_equal_transformers(mode: str) -> None:
    """The engine patches `Image.rgb()`: as transformers converts the decoded original."""
    from transformers import Qwen2VLImageProcessorPil

    encoded = io.BytesIO()
    _other_modes()[mode].save(encoded, format="PNG")
    rgb = decode_image(encoded.getvalue(), "image/png", DEFAULT_LIMITS).rgb()
    config = Qwen2VLProcessorConfig.from_hf(SMALL)
    _assert_same_as_hf(config, Qwen2VLImageProcessorPil(**SMALL), rgb, PILImage.open(encoded))


# -- prompt layout ------------------------------------------------------------------------------


def _tokenizer() -> Any:
    """Byte-level, no merges: every character is a token, so ids decode back to the exact text;
    Qwen's vision markers are added tokens, as in its tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({char: i for i, char in enumerate(sorted(alphabet))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.add_tokens(["<|vision_start|>", "<|vision_end|>", IMAGE_PAD, "<|video_pad|>"], special_tokens=True)
    return fast


def _spec(config: Qwen2VLProcessorConfig) -> QwenVLPromptSpec:
    return QwenVLPromptSpec(_tokenizer().convert_tokens_to_ids(IMAGE_PAD), config)


def _prompt(num_images: int) -> str:
    images = "".join(f"<|vision_start|>{IMAGE_PAD}<|vision_end|>picture {i}\n" for i in range(num_images))
    return f"<|im_start|>user\n{images}What differs?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("sizes", [[(90, 40)], [(64, 64), (200, 30)], [(1, 1), (333, 517), (20, 30)]])
def test_prompt_equals_transformers(setting: tuple[Any, Any], sizes: list[tuple[int, int]]) -> None:
    config, hf_image_processor = setting
    hf = hf_qwen_processor(hf_image_processor, _tokenizer())
    pictures = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    images = [_encoded(p) for p in pictures]
    spec, text = _spec(config), _prompt(len(images))

    ours = spec.expand(text, images)
    expected = hf(text=[text], images=pictures)
    ids = expected["input_ids"][0]
    assert hf.tokenizer(ours)["input_ids"] == ids

    spans = spec.spans(ids, images)
    merge = config.merge_size
    grids = [(t, h // merge, w // merge) for t, h, w in expected["image_grid_thw"].tolist()]
    assert [s.grid for s in spans] == grids
    for span, (t, h, w) in zip(spans, grids, strict=True):
        assert span.num_tokens == t * h * w
        assert set(ids[span.offset : span.offset + span.num_tokens]) == {spec.image_token_id}
        assert ids[span.offset - 1] == hf.tokenizer.convert_tokens_to_ids("<|vision_start|>")
        assert ids[span.offset + span.num_tokens] == hf.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    assert [s.offset for s in spans] == sorted(s.offset for s in spans)


@pytest.mark.parametrize("num_images", [0, 2])
def test_placeholders_must_match_the_images(num_images: int) -> None:
    """A `<|image_pad|>` a client typed as text: which image goes where is unknown (a 400)."""
    spec = _spec(Qwen2VLProcessorConfig.from_hf(SMALL))
    images = [_encoded(_image(8, 8))] * num_images
    typed = _prompt(1).replace("What differs?", f"what is {IMAGE_PAD}?")
    message = rf"2 <\|image_pad\|> placeholders in the prompt \(1 as the chat template writes them\) but {num_images}"
    with pytest.raises(ImagePromptError, match=message):
        spec.expand(typed, images)


def test_spans_refuse_tokens_that_do_not_fit() -> None:
    spec = _spec(Qwen2VLProcessorConfig.from_hf(SMALL))
    image = _encoded(_image(8, 8))  # min_pixels: 16 x 16 pixels, 4 x 4 tokens
    pad = spec.image_token_id
    with pytest.raises(ImagePromptError, match="has 15 image tokens where its 1 images need 16"):
        spec.spans([1, *[pad] * 15, 2], [image])
    with pytest.raises(ImagePromptError, match="not one run of 16"):
        spec.spans([1, *[pad] * 8, 2, *[pad] * 8], [image])
    with pytest.raises(ImagePromptError, match="aspect ratio"):
        spec.expand(_prompt(1), [_encoded(_image(1, 300))])


def test_spec_is_picked_from_the_vision_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path, QWEN25_VL)
    spec = image_prompt_spec(Qwen2_5VisionConfig(), folder / "model.safetensors")
    assert spec == QwenVLPromptSpec(151655, Qwen2VLProcessorConfig.from_hf(QWEN25_VL))
    # A processor whose patches are not the tower's: no prompt could be laid out, images are off.
    assert image_prompt_spec(Qwen2_5VisionConfig(patch_size=16), folder) is None


def test_a_patched_image_crosses_to_the_engine_as_its_encoded_bytes() -> None:
    """PatchedImage: the shape from the size alone, the processor's patches, a pickle of the file."""
    config = Qwen2VLProcessorConfig.from_hf(QWEN25_VL)
    image = _encoded(_image(300, 200, seed=3))
    source = _spec(config).tiles(image)
    assert source.grid == PatchGrid(1, 14, 22)
    patches = source.tensor()
    assert source.shape == tuple(patches.shape) == (14 * 22, 3 * 2 * 14 * 14)
    assert torch.equal(patches, process_image(image.rgb(), config).pixel_values)
    sent = pickle.dumps(source)
    assert len(sent) < len(image.data) + 4096
    assert torch.equal(pickle.loads(sent).tensor(), patches)
