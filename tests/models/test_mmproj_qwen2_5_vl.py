"""llama.cpp's pair of files for Qwen2.5-VL (issue 34): a tiny Qwen2.5-VL folder written as a `qwen2vl`
language GGUF plus a `qwen2.5vl_merger` mmproj (loader/gguf_export.py) and loaded back
(loader/mmproj_qwen2_5_vl.py) gives the folder's prompt tokens, image processor and, in fp32, the
same logits as the folder and as transformers over prompts with images; a file as llama.cpp's own
converter writes it (no window, merge or pixel-bound keys) gets clip.cpp's fixed values."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from kvserve.chat.image import Image
from kvserve.engine.image_input import ImageInput
from kvserve.engine.positions import PositionLayout
from kvserve.models.errors import ModelLoadError, UnsupportedModelError
from kvserve.models.loaded import LoadedModel
from kvserve.models.loader import load_model
from kvserve.models.loader.gguf_export import write_gguf_pair
from kvserve.models.loader.mmproj_export import write_mmproj
from kvserve.models.loader.mmproj_format import MmprojKeys
from kvserve.models.loader.mmproj_idefics3 import expected_shapes as idefics3_shapes
from kvserve.models.loader.mmproj_idefics3 import hf_vision_name
from kvserve.models.loader.mmproj_qwen2_5_vl import QWEN2_5_VL, mrope_sections
from kvserve.models.vision.config import VisionArchConfig
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig
from kvserve.models.vision.qwen2_vl_processor import process_image
from kvserve.models.vision.qwen2_vl_prompt import QwenVLPromptSpec
from tests.models.helpers import PagedDriver
from tests.models.test_mmproj import Loaded, _image, _prompt_ids, _spec
from tests.models.tiny_qwen_vl import TINY, save_tiny_qwen_vl

# Measured: 0.0 (bit-equal) between the pair and the folder; 4.2e-7 from transformers (its eager
# attention sums in another order), with logits up to 0.8; f16 matrices: 3.5e-4.
PAIR_ATOL = 0.0
HF_ATOL = 1e-5
F16_ATOL = 1e-3


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    root = tmp_path_factory.mktemp("mmproj-qwen")
    folder = save_tiny_qwen_vl(root / "tiny-qwen-vl")
    # The tiny folder borrows SmolLM2's vocabulary, so llama.cpp would hash it as "smollm".
    pair = write_gguf_pair(folder, root / "gguf", tokenizer_pre="smollm")
    from_pair = load_model(pair.language, torch.float32, progress=False, mmproj=pair.mmproj)
    return Loaded(folder, pair, load_model(folder, torch.float32, progress=False), from_pair)


@pytest.fixture(scope="module")
def hf_model(loaded: Loaded) -> Any:
    import transformers

    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        loaded.folder, dtype=torch.float32
    ).eval()


class Inputs(NamedTuple):
    ids: list[int]
    pixels: torch.Tensor  # [num_patches, patch_dim], the images' patches concatenated
    images: list[ImageInput]  # each image's span and token grid


def _inputs(model: LoadedModel, layout: str, images: list[Image]) -> Inputs:
    spec = _spec(model)
    assert isinstance(spec, QwenVLPromptSpec)
    ids = _prompt_ids(model, layout, images)
    pixels = [process_image(image.rgb(), spec.processor).pixel_values for image in images]
    spans = spec.spans(ids, images)
    inputs = [
        ImageInput(f"image-{i}", span.offset, span.num_tokens, p, grid=span.grid)
        for i, (span, p) in enumerate(zip(spans, pixels, strict=True))
    ]
    return Inputs(ids, torch.cat(pixels), inputs)


def _our_logits(model: LoadedModel, inputs: Inputs) -> torch.Tensor:
    ours = model.model
    grids = [image.grid for image in inputs.images]
    layout = PositionLayout.of(inputs.images)
    assert layout is not None
    positions = torch.from_numpy(layout.positions3(0, len(inputs.ids)))  # [3, num_tokens]
    with torch.no_grad():
        rows = ours.encode_images(inputs.pixels, grids)  # [num_image_tokens, hidden]
        embeds = ours.embed_inputs(torch.tensor(inputs.ids), rows)
    return PagedDriver(ours).step([(0, inputs.ids)], inputs_embeds=embeds, positions3=positions)


def _hf_logits(hf_model: Any, inputs: Inputs, merge: int) -> torch.Tensor:
    ids = torch.tensor([inputs.ids])
    grid_thw = torch.tensor([(t, h * merge, w * merge) for t, h, w in (i.grid for i in inputs.images)])
    with torch.no_grad():
        return hf_model(
            input_ids=ids,
            pixel_values=inputs.pixels,
            image_grid_thw=grid_thw,
            mm_token_type_ids=(ids == hf_model.config.image_token_id).int(),
        ).logits[0]


# (width, height) -> tokens (h x w): 4 x 6 (more than one 2 x 2 window), 4 x 4, and 9 x 2 (resized
# down to max_pixels).
LAYOUTS = {
    "start": ("IT", [(50, 34)]),
    "middle": ("TIT", [(30, 30)]),
    "two_images": ("TITIT", [(50, 34), (20, 70)]),
}


@pytest.mark.parametrize("case", LAYOUTS, ids=list(LAYOUTS))
def test_pair_logits_match_the_folder_and_transformers(loaded: Loaded, hf_model: Any, case: str) -> None:
    layout, sizes = LAYOUTS[case]
    images = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    inputs = _inputs(loaded.from_folder, layout, images)
    from_pair_inputs = _inputs(loaded.from_pair, layout, images)
    assert from_pair_inputs.ids == inputs.ids and torch.equal(from_pair_inputs.pixels, inputs.pixels)
    assert [i.grid for i in from_pair_inputs.images] == [i.grid for i in inputs.images]
    assert any(h > 2 or w > 2 for _, h, w in (i.grid for i in inputs.images))  # windows matter
    from_folder = _our_logits(loaded.from_folder, inputs)
    from_pair = _our_logits(loaded.from_pair, inputs)
    torch.testing.assert_close(from_pair, from_folder, atol=PAIR_ATOL, rtol=0)
    merge = loaded.from_folder.arch.vision.spatial_merge_size
    torch.testing.assert_close(from_pair, _hf_logits(hf_model, inputs, merge), atol=HF_ATOL, rtol=0)


def test_the_pair_is_the_folders_model(loaded: Loaded) -> None:
    """Config, weights, tokenizer, template and image processor from the two files are the folder's
    (the decoder's eps and the processor's mean/std as the float32 the files hold)."""
    folder, pair = loaded.from_folder, loaded.from_pair
    assert type(pair.model) is type(folder.model)
    assert (
        pair.arch.vision == folder.arch.vision
        and pair.arch.mrope_section == folder.arch.mrope_section == (2, 3, 3)
    )
    assert dataclasses.replace(pair.arch, rms_norm_eps=folder.arch.rms_norm_eps) == folder.arch
    folder_weights = folder.model.state_dict()
    assert all(torch.equal(t, folder_weights[n]) for n, t in pair.model.state_dict().items())
    ours, theirs = _spec(pair).processor, _spec(folder).processor
    for field in ("image_mean", "image_std"):  # what normalizing uses: float32
        assert np.array_equal(np.float32(getattr(ours, field)), np.float32(getattr(theirs, field)))
    assert ours == dataclasses.replace(theirs, image_mean=ours.image_mean, image_std=ours.image_std)
    assert pair.tokenizer.chat_template == folder.tokenizer.chat_template
    assert pair.tokenizer.tokenizer.get_vocab() == folder.tokenizer.tokenizer.get_vocab()
    assert set(pair.tokenizer.eos_token_ids) == set(folder.tokenizer.eos_token_ids)


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_the_files_are_laid_out_as_llama_cpps(loaded: Loaded) -> None:
    """The keys and tensors llama.cpp's convert_hf_to_gguf.py writes and clip.cpp reads."""
    language = gguf.GGUFReader(loaded.pair.language)
    assert _field(language, "general.architecture") == "qwen2vl"
    assert _field(language, "qwen2vl.rope.dimension_sections") == [2, 3, 3, 0]
    assert {"blk.0.attn_q.bias", "blk.1.attn_output.weight", "output.weight"} <= {
        t.name for t in language.tensors
    }

    mmproj = gguf.GGUFReader(loaded.pair.mmproj)
    assert _field(mmproj, "clip.projector_type") == "qwen2.5vl_merger"
    assert _field(mmproj, "general.type") == "mmproj"
    assert _field(mmproj, "clip.use_silu") is True
    assert _field(mmproj, "clip.vision.n_wa_pattern") == 2  # fullatt_block_indexes [1]
    assert _field(mmproj, "clip.vision.image_size") == 560  # the converter's default
    tensors = {t.name: t for t in mmproj.tensors}
    for frame in ("v.patch_embd.weight", "v.patch_embd.weight.1"):  # the Conv3d, one Conv2d per frame
        assert (list(tensors[frame].shape), tensors[frame].tensor_type) == ([4, 4, 3, 32], Q.F32)
    assert {"v.blk.0.attn_q.bias", "v.blk.0.attn_k.weight", "v.blk.1.ffn_gate.weight"} <= tensors.keys()
    assert not any("qkv" in name for name in tensors)
    assert list(tensors["mm.0.weight"].shape) == [128, 128] and list(tensors["mm.2.weight"].shape) == [
        128,
        64,
    ]
    assert "v.post_ln.weight" in tensors and "v.post_ln.bias" not in tensors


def _keys(**metadata: Any) -> MmprojKeys:
    base = {
        "clip.use_silu": True,
        "clip.vision.block_count": 32,
        "clip.vision.patch_size": 14,
        "clip.vision.embedding_length": 1280,
        "clip.vision.feed_forward_length": 3420,
        "clip.vision.attention.head_count": 16,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.n_wa_pattern": 8,
    }
    fake = SimpleNamespace(path=Path("mmproj-x.gguf"), metadata=base | metadata)
    return MmprojKeys(fake)  # type: ignore[arg-type]


def test_a_file_from_llama_cpps_converter_gets_clip_cpps_fixed_values() -> None:
    """Qwen2.5-VL-3B's header as convert_hf_to_gguf.py writes it: no window, merge or pixel-bound
    keys, so clip.cpp's 112-px windows, 2 x 2 merging and 8 to 4096 tokens per image."""
    header = QWEN2_5_VL.read_header(_keys(), 2048)
    vision, processor = header.vision_config, header.processor
    assert vision["fullatt_block_indexes"] == [7, 15, 23, 31]  # the released config's
    assert (vision["window_size"], vision["spatial_merge_size"], vision["out_hidden_size"]) == (112, 2, 2048)
    assert (processor.min_pixels, processor.max_pixels) == (8 * 28 * 28, 4096 * 28 * 28)
    assert processor.grid(1280, 720) == (1, 52, 92)  # 26 x 46 tokens
    assert QWEN2_5_VL.read_header(_keys(**{"clip.vision.n_wa_pattern": 0}), 2048).vision_config[
        "fullatt_block_indexes"
    ] == list(range(32))  # no pattern: full attention everywhere


# Keys our exporter writes that llama.cpp's converter leaves to clip.cpp's fixed values.
OUR_KEYS = (
    "clip.vision.window_size",
    "clip.vision.spatial_merge_size",
    "clip.vision.image_min_pixels",
    "clip.vision.image_max_pixels",
)
# A tiny tower of llama.cpp's fixed geometry: 14-px patches, 112-px windows (4 x 4 tokens), images of
# 8 to 4096 tokens.
LLAMA_CPP_GEOMETRY = {
    **TINY,
    "vision": {**TINY["vision"], "patch_size": 14, "window_size": 112},
    "min_pixels": 8 * 28 * 28,
    "max_pixels": 4096 * 28 * 28,
}


def _without_keys(source: Path, target: Path, dropped: tuple[str, ...]) -> Path:
    """`source` rewritten without the `dropped` metadata keys: the file llama.cpp's converter makes."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, _field(reader, "general.architecture"))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in dropped:
            continue
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_a_pair_as_llama_cpps_converter_writes_it_is_the_folders_model(tmp_path: Path) -> None:
    """A folder of llama.cpp's fixed geometry, its mmproj without our four keys: the tower, the
    processor and the logits (two images, several windows each) are the folder's all the same."""
    folder = save_tiny_qwen_vl(tmp_path / "tiny-llama-cpp-geometry", shapes=LLAMA_CPP_GEOMETRY)
    pair = write_gguf_pair(folder, tmp_path / "gguf", tokenizer_pre="smollm")
    mmproj = _without_keys(pair.mmproj, tmp_path / "mmproj-converted.gguf", OUR_KEYS)
    assert not set(OUR_KEYS) & gguf.GGUFReader(mmproj).fields.keys()
    from_folder = load_model(folder, torch.float32, progress=False)
    from_pair = load_model(pair.language, torch.float32, progress=False, mmproj=mmproj)
    assert from_pair.arch.vision == from_folder.arch.vision
    ours, theirs = _spec(from_pair).processor, _spec(from_folder).processor
    assert (ours.min_pixels, ours.max_pixels, ours.merge_size) == (theirs.min_pixels, theirs.max_pixels, 2)
    images = [_image(200, 150, seed=0), _image(60, 40, seed=1)]  # 5 x 7 tokens; 40 x 60 px scaled up
    inputs = _inputs(from_folder, "TITIT", images)
    assert _inputs(from_pair, "TITIT", images).ids == inputs.ids
    assert max(max(i.grid) for i in inputs.images) > 4  # more than one 112-px window
    torch.testing.assert_close(
        _our_logits(from_pair, inputs), _our_logits(from_folder, inputs), atol=0, rtol=0
    )


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"clip.use_silu": False}, "MLP must be SiLU"),
        ({"clip.vision.attention.layer_norm_epsilon": 1e-5}, "tower norm epsilon 1e-05"),
        ({"clip.vision.window_size": 100}, "is not one Qwen2.5-VL can be"),
        ({"clip.vision.image_min_pixels": 9000, "clip.vision.image_max_pixels": 8000}, "are empty"),
        ({"clip.vision.n_wa_pattern": None}, "'clip.vision.n_wa_pattern' is missing"),
    ],
)
def test_a_header_qwen2_5_vl_cannot_be_is_an_error(metadata: dict[str, Any], match: str) -> None:
    keys = _keys(**metadata)
    keys.metadata = {k: v for k, v in keys.metadata.items() if v is not None}
    with pytest.raises(ModelLoadError, match=match) as raised:
        QWEN2_5_VL.read_header(keys, 2048)
    assert "mmproj-x.gguf" in str(raised.value)


def test_an_f16_pair_gives_close_logits(loaded: Loaded, tmp_path: Path) -> None:
    pair = write_gguf_pair(loaded.folder, tmp_path, outtype="f16", tokenizer_pre="smollm")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(pair.mmproj).tensors}
    assert (types["v.patch_embd.weight"], types["mm.0.weight"], types["v.blk.0.ln1.weight"]) == (
        Q.F16,
        Q.F16,
        Q.F32,
    )
    from_f16 = load_model(loaded.pair.language, torch.float32, progress=False, mmproj=pair.mmproj)
    images = [_image(50, 34, seed=0)]
    inputs = _inputs(loaded.from_folder, "TIT", images)
    expected = _our_logits(loaded.from_folder, inputs)
    torch.testing.assert_close(_our_logits(from_f16, inputs), expected, atol=F16_ATOL, rtol=0)


def _idefics3_mmproj(path: Path, text_hidden_size: int) -> Path:
    """A one-block idefics3 mmproj of zeros for a language model of `text_hidden_size`."""
    vision = VisionArchConfig(32, 64, 1, 4, image_size=32, patch_size=8)
    shapes = idefics3_shapes(dataclasses.asdict(vision), vision.scale_factor, text_hidden_size)
    tensors = {hf_vision_name(name): torch.zeros(shape) for name, shape in shapes.items()}
    processor = Idefics3ProcessorConfig(longest_edge=64, tile_size=32, image_seq_len=4)
    write_mmproj(path, "idefics3", vision, text_hidden_size, processor, tensors, "f32")
    return path


def test_a_projector_beside_another_language_architecture(
    loaded: Loaded, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An idefics3 projector of the right width beside the qwen2vl file: asked for, an error naming
    it; found beside the model, a warning, and the text model (Qwen2) serves."""
    language = tmp_path / loaded.pair.language.name
    language.symlink_to(loaded.pair.language)  # the same file: its converted tokenizer is reused
    mmproj = _idefics3_mmproj(tmp_path / "mmproj-idefics3.gguf", loaded.from_pair.arch.hidden_size)
    with pytest.raises(
        UnsupportedModelError, match="goes with a llama language model, not .* qwen2vl"
    ) as raised:
        load_model(language, torch.float32, progress=False, mmproj=mmproj)
    assert str(mmproj) in str(raised.value)
    with caplog.at_level(logging.WARNING, logger="kvserve.models.loader.load"):
        text_only = load_model(language, torch.float32, progress=False, mmproj="auto")
    assert text_only.arch.vision is None and text_only.arch.architecture == "qwen2"
    assert "serving the text model without images" in caplog.text


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ([16, 24, 24, 0], (16, 24, 24)),  # Qwen2.5-VL-3B's, as the converter pads them
        ([2, 3, 3], (2, 3, 3)),
        ([16, 24, 24, 8], "are not \\(t, h, w\\[, 0\\]\\)"),  # a fourth section: not Qwen2.5-VL
        (None, "'qwen2vl.rope.dimension_sections' \\(M-RoPE sections\\) is missing"),
        (7, "is no list of counts"),
    ],
)
def test_the_mrope_sections_come_from_the_language_file(sections: Any, expected: Any) -> None:
    metadata = {"general.architecture": "qwen2vl"}
    if sections is not None:
        metadata["qwen2vl.rope.dimension_sections"] = sections
    language = SimpleNamespace(path=Path("lang.gguf"), metadata=metadata, architecture="qwen2vl")
    if isinstance(expected, tuple):
        assert mrope_sections(language) == expected  # type: ignore[arg-type]
        return
    with pytest.raises(ModelLoadError, match=expected) as raised:
        mrope_sections(language)  # type: ignore[arg-type]
    assert "lang.gguf" in str(raised.value)
