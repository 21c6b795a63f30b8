"""Idefics3 / SmolVLM image preprocessing and prompt expansion against transformers: the tiles
against `Idefics3ImageProcessorPil` (exactly equal, atol = rtol = 0), the prompt text and ids
against `Idefics3Processor`. Both sides read the settings from the same model folder."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from kvserve.chat.image import decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.models.vision.idefics3_processor import (
    Idefics3ProcessorConfig,
    ProcessedImage,
    image_grid,
    process_image,
)
from kvserve.models.vision.idefics3_prompt import (
    IMAGE_TOKEN,
    ImagePlaceholderError,
    expand_image_placeholders,
    image_prompt,
    num_image_tokens,
)

# SmolVLM-256M-Instruct's preprocessor_config.json (its processor_config.json: image_seq_len 64).
SMOLVLM = {
    "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
    "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 512}, "resample": 1, "rescale_factor": 1 / 255,
    "size": {"longest_edge": 2048},
}  # fmt: skip
# The tiny model of test_idefics3_parity.py: 32-pixel tiles of 4 tokens.
TINY = SMOLVLM | {"max_image_size": {"longest_edge": 32}, "size": {"longest_edge": 64}}
# Other knobs: no splitting (one squashed tile), bicubic, ImageNet statistics.
TINY_UNSPLIT = TINY | {
    "do_image_splitting": False, "resample": 3,
    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
}  # fmt: skip
# Tiles cut from the image at its own size (1920 x 1080: 8 x 5 tiles).
UNRESIZED = SMOLVLM | {"do_resize": False, "max_image_size": {"longest_edge": 256}}
SETTINGS = {
    "smolvlm": (SMOLVLM, 64), "tiny": (TINY, 4), "tiny_unsplit": (TINY_UNSPLIT, 4), "unresized": (UNRESIZED, 16),
}  # fmt: skip

# (width, height): one pixel, portrait, landscape, whole tiles, a screenshot, under a tile; the
# resized short side of the last two is odd before transformers rounds it up to even.
SIZES = [(1, 1), (300, 800), (800, 300), (1024, 512), (1920, 1080), (200, 150), (333, 517), (801, 300)]


def _image(width: int, height: int, seed: int = 0, bands: int = 3) -> PILImage.Image:
    """Noise, the hardest input for resampling to get right; 1, 2, 4 bands: L, LA, RGBA."""
    noise = np.random.default_rng(seed).integers(0, 256, (height, width, bands), dtype=np.uint8)
    return PILImage.fromarray(noise[..., 0] if bands == 1 else noise)


def _model_folder(path: Path, settings: dict[str, Any], image_seq_len: int) -> Path:
    """An HF folder as the hub has SmolVLM's: preprocessor_config.json and processor_config.json."""
    (path / "preprocessor_config.json").write_text(json.dumps(settings))
    (path / "processor_config.json").write_text(json.dumps({"image_seq_len": image_seq_len}))
    return path


@pytest.fixture(scope="module", params=list(SETTINGS))
def setting(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(our config, transformers' PIL image processor), both from one folder."""
    from transformers import Idefics3ImageProcessorPil

    settings, image_seq_len = SETTINGS[request.param]
    folder = _model_folder(tmp_path_factory.mktemp(request.param), settings, image_seq_len)
    return Idefics3ProcessorConfig.from_folder(folder), Idefics3ImageProcessorPil.from_pretrained(folder)


def _hf_tiles(hf: Any, image: PILImage.Image) -> tuple[torch.Tensor, int, int]:
    out = hf(images=[image], return_row_col_info=True, return_tensors="pt")
    return out["pixel_values"][0], out["rows"][0][0], out["cols"][0][0]


def _assert_same_as_hf(ours: ProcessedImage, hf: Any, image: PILImage.Image) -> None:
    pixel_values, rows, cols = _hf_tiles(hf, image)
    assert (ours.rows, ours.cols, ours.num_tiles) == (rows, cols, pixel_values.shape[0])
    torch.testing.assert_close(ours.pixel_values, pixel_values, atol=0, rtol=0)


@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_tiles_equal_transformers(setting: tuple[Any, Any], width: int, height: int) -> None:
    config, hf = setting
    image = _image(width, height, seed=width + height)
    ours = process_image(image, config)
    side = config.tile_size
    assert ours.pixel_values.shape == (ours.num_tiles, 3, side, side)
    assert ours.pixel_values.dtype == torch.float32
    _assert_same_as_hf(ours, hf, image)
    assert image_grid(width, height, config) == (ours.rows, ours.cols)  # from the size alone


def test_defaults_are_smolvlm(tmp_path: Path) -> None:
    assert (
        Idefics3ProcessorConfig.from_folder(_model_folder(tmp_path, SMOLVLM, 64)) == Idefics3ProcessorConfig()
    )


def test_folder_saved_by_transformers_5(tmp_path: Path) -> None:
    """transformers 5 nests the image processor's settings in processor_config.json."""
    from transformers import Idefics3ImageProcessorPil

    _processor(Idefics3ImageProcessorPil(**TINY_UNSPLIT), image_seq_len=9).save_pretrained(tmp_path)
    assert not (tmp_path / "preprocessor_config.json").exists()
    config = Idefics3ProcessorConfig.from_folder(tmp_path)
    assert config == Idefics3ProcessorConfig.from_hf(TINY_UNSPLIT, image_seq_len=9)
    assert (config.tile_size, config.resample) == (32, PILImage.Resampling.BICUBIC)


def _tokenizer() -> Any:
    """Byte-level, no merges: every character is a token, so ids decode back to the exact text;
    Idefics3's markers are added tokens, as in SmolVLM's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({char: i for i, char in enumerate(sorted(alphabet))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    markers = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    fast.add_tokens(["<fake_token_around_image>", IMAGE_TOKEN, "<global-img>", *markers], special_tokens=True)
    return fast


def _processor(image_processor: Any, image_seq_len: int) -> Any:
    from transformers import Idefics3Processor

    return Idefics3Processor(
        image_processor=image_processor, tokenizer=_tokenizer(), image_seq_len=image_seq_len
    )


# The SmolVLM case is one image: each costs ~0.5 s there (every image is upscaled to 2048 pixels).
PROMPT_CASES = {
    "smolvlm-one": ("smolvlm", [(90, 40)]),
    "tiny-one": ("tiny", [(90, 40)]),
    "tiny-three": ("tiny", [(64, 64), (200, 30), (1, 1)]),
    "tiny_unsplit-two": ("tiny_unsplit", [(40, 90), (16, 16)]),
}


@pytest.mark.parametrize(
    ("setting", "sizes"), list(PROMPT_CASES.values()), ids=list(PROMPT_CASES), indirect=["setting"]
)
def test_prompt_equals_transformers(setting: tuple[Any, Any], sizes: list[tuple[int, int]]) -> None:
    config, hf_image_processor = setting
    hf = _processor(hf_image_processor, config.image_seq_len)
    images = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    text = "<|im_start|>User:" + "".join(f"{IMAGE_TOKEN}picture {i}\n" for i in range(len(images)))
    text += "What differs?<end_of_utterance>\nAssistant:"
    processed = [process_image(image, config) for image in images]

    ours = expand_image_placeholders(text, [(p.rows, p.cols) for p in processed], config.image_seq_len)

    ids = hf(text=[text], images=[images])["input_ids"][0]
    assert ours == hf.tokenizer.decode(ids)
    assert hf.tokenizer(ours)["input_ids"] == ids
    image_token_id = hf.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    counts = [num_image_tokens(p.rows, p.cols, config.image_seq_len) for p in processed]
    assert (
        ids.count(image_token_id) == sum(counts) == config.image_seq_len * sum(p.num_tiles for p in processed)
    )


def test_image_prompt_layout() -> None:
    assert (
        image_prompt(0, 0, 2)
        == "<fake_token_around_image><global-img><image><image><fake_token_around_image>"
    )
    tile = "<fake_token_around_image><row_{}_col_{}><image>"
    assert image_prompt(2, 2, 1) == (
        tile.format(1, 1) + tile.format(1, 2) + "\n" + tile.format(2, 1) + tile.format(2, 2) + "\n"
        "\n<fake_token_around_image><global-img><image><fake_token_around_image>"
    )  # fmt: skip


@pytest.mark.parametrize("num_images", [0, 2])
def test_placeholders_must_match_the_images(num_images: int) -> None:
    with pytest.raises(
        ImagePlaceholderError, match=f"1 <image> placeholders in the prompt but {num_images} images"
    ):
        expand_image_placeholders("look: <image>", [(1, 2)] * num_images, 4)


def test_text_without_images_is_unchanged() -> None:
    assert expand_image_placeholders("no images here", [], 64) == "no images here"


def _other_modes() -> dict[str, PILImage.Image]:
    palette = _image(40, 70, seed=4).convert("P")
    transparent = palette.copy()
    transparent.info["transparency"] = 7  # one palette entry is see-through (PNG tRNS)
    return {
        "RGBA": _image(40, 70, seed=1, bands=4), "LA": _image(40, 70, seed=2, bands=2),
        "L": _image(40, 70, seed=3, bands=1), "P": palette, "P_transparency": transparent,
        "CMYK": _image(40, 70, seed=5).convert("CMYK"),
    }  # fmt: skip


@pytest.mark.parametrize("mode", list(_other_modes()))
def test_other_modes_through_image_rgb_equal_transformers(mode: str) -> None:
    """The engine hands over `Image.rgb()`: transparency composited on white and other modes
    converted exactly as transformers converts the decoded original."""
    from transformers import Idefics3ImageProcessorPil

    encoded, media_type = io.BytesIO(), "image/jpeg" if mode == "CMYK" else "image/png"
    _other_modes()[mode].save(encoded, format=media_type.removeprefix("image/"))
    rgb = decode_image(encoded.getvalue(), media_type, DEFAULT_LIMITS).rgb()
    config = Idefics3ProcessorConfig.from_hf(TINY)
    _assert_same_as_hf(process_image(rgb, config), Idefics3ImageProcessorPil(**TINY), PILImage.open(encoded))


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_non_rgb_image_is_refused(mode: str) -> None:
    with pytest.raises(ValueError, match=f"expected an RGB image .* got mode '{mode}'"):
        process_image(PILImage.new(mode, (8, 8)), Idefics3ProcessorConfig())


def test_a_tiled_image_crosses_to_the_engine_as_its_encoded_bytes() -> None:
    """TiledImage: the shape without tiling, the same tiles as process_image, and a pickle the size
    of the client's file rather than of the float32 tiles."""
    import pickle

    from PIL import ImageDraw

    from kvserve.models.vision.image_prompt import TiledImage

    screenshot = PILImage.new("RGB", (1920, 1080), "white")  # a screenshot compresses, as real ones do
    draw = ImageDraw.Draw(screenshot)
    for i in range(40):
        draw.rectangle((i * 40, i * 20, i * 40 + 300, i * 20 + 30), fill=(i * 6, 120, 255 - i * 6))
        draw.text((i * 40 + 10, i * 20 + 8), f"line {i}: def f(x): return x", fill="black")
    buffer = io.BytesIO()
    screenshot.save(buffer, "PNG")
    data = buffer.getvalue()
    source = TiledImage(decode_image(data, "image/png", DEFAULT_LIMITS), Idefics3ProcessorConfig())
    tiles = source.tensor()
    assert source.shape == tuple(tiles.shape) == (13, 3, 512, 512)
    assert torch.equal(tiles, process_image(source.image.rgb(), Idefics3ProcessorConfig()).pixel_values)
    sent = pickle.dumps(source)
    assert len(sent) < len(data) + 4096 < tiles.numel() * 4 // 100
    assert torch.equal(pickle.loads(sent).tensor(), tiles)
