"""llama.cpp's pair of files for a vision model (issue 34): a tiny SmolVLM folder written as a language
GGUF plus an `mmproj` GGUF (loader/gguf_export.py) and loaded back (loader/mmproj.py) gives the
folder's prompt tokens, image processor and, in fp32, the same logits as the folder and as
transformers over prompts with images; a bad or mismatched mmproj is a start-up error naming it."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from PIL import Image as PILImage

from kvserve.chat.image import Image, decode_image
from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.config import EngineConfig
from kvserve.engine.cache_key import cache_key
from kvserve.models.errors import CorruptModelFileError, ModelLoadError, UnsupportedModelError
from kvserve.models.loaded import LoadedModel
from kvserve.models.loader import load_model
from kvserve.models.loader.gguf_export import GGUFPair, write_gguf_pair
from kvserve.models.loader.gguf_reader import read_gguf
from kvserve.models.loader.mmproj import find_mmproj
from kvserve.models.loader.mmproj_export import write_mmproj
from kvserve.models.loader.safetensors import iter_safetensors
from kvserve.models.vision.idefics3_processor import process_image
from kvserve.models.vision.image_prompt import ImagePromptSpec, image_prompt_spec
from tests.models.helpers import PagedDriver
from tests.models.tiny_vlm import save_tiny_vlm

# Measured: 0.0 (bit-equal) between the pair and the folder, 2.4e-7 from transformers (whose eager
# attention sums in another order than ours), with logits up to 0.8.
PAIR_ATOL = 0.0
HF_ATOL = 1e-5
F16_ATOL = 1e-3  # f16 matrices: 3.7e-4 measured


class Loaded(NamedTuple):
    folder: Path
    pair: GGUFPair
    from_folder: LoadedModel
    from_pair: LoadedModel


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    root = tmp_path_factory.mktemp("mmproj")
    folder = save_tiny_vlm(root / "tiny-smolvlm")
    pair = write_gguf_pair(folder, root / "gguf")
    from_pair = load_model(pair.language, torch.float32, progress=False, mmproj=pair.mmproj)
    return Loaded(folder, pair, load_model(folder, torch.float32, progress=False), from_pair)


@pytest.fixture(scope="module")
def hf_model(loaded: Loaded) -> torch.nn.Module:
    import transformers

    return transformers.Idefics3ForConditionalGeneration.from_pretrained(
        loaded.folder, dtype=torch.float32
    ).eval()


def _image(width: int, height: int, seed: int) -> Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    data = io.BytesIO()
    PILImage.fromarray(pixels).save(data, format="PNG")
    return decode_image(data.getvalue(), "image/png", DEFAULT_LIMITS)


def _spec(model: LoadedModel) -> ImagePromptSpec:
    spec = image_prompt_spec(model.arch.vision, model.path, model.image_processor)
    assert spec is not None
    return spec


def _prompt_ids(model: LoadedModel, layout: str, images: list[Image]) -> list[int]:
    """`layout`: T a text part, I an image part, in one user turn rendered by the model's template."""
    parts = [{"type": "text", "text": "What is here?"} if p == "T" else {"type": "image"} for p in layout]
    tokenizer = model.tokenizer.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}],
        chat_template=model.tokenizer.chat_template,
        tokenize=False,
        add_generation_prompt=True,
    )
    return tokenizer.encode(_spec(model).expand(text, images), add_special_tokens=False)


def _pixels(model: LoadedModel, images: list[Image]) -> torch.Tensor:
    processor = _spec(model).processor
    return torch.cat([process_image(image.rgb(), processor).pixel_values for image in images])


def _our_logits(model: LoadedModel, ids: list[int], pixels: torch.Tensor) -> torch.Tensor:
    ours = model.model
    with torch.no_grad():
        rows = ours.encode_images(pixels).reshape(-1, ours.arch.hidden_size)  # [num_image_tokens, hidden]
        embeds = ours.embed_inputs(torch.tensor(ids), rows)
    return PagedDriver(ours).step([(0, ids)], inputs_embeds=embeds)


LAYOUTS = {
    "start": ("IT", [(50, 40)]),
    "middle": ("TIT", [(20, 30)]),
    "two_images": ("TITIT", [(50, 40), (32, 70)]),
}


@pytest.mark.parametrize("case", LAYOUTS, ids=list(LAYOUTS))
def test_pair_logits_match_the_folder_and_transformers(
    loaded: Loaded, hf_model: torch.nn.Module, case: str
) -> None:
    layout, sizes = LAYOUTS[case]
    images = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    ids = _prompt_ids(loaded.from_folder, layout, images)
    assert _prompt_ids(loaded.from_pair, layout, images) == ids
    pixels = _pixels(loaded.from_folder, images)
    assert torch.equal(_pixels(loaded.from_pair, images), pixels)
    from_folder = _our_logits(loaded.from_folder, ids, pixels)
    from_pair = _our_logits(loaded.from_pair, ids, pixels)
    torch.testing.assert_close(from_pair, from_folder, atol=PAIR_ATOL, rtol=0)
    with torch.no_grad():
        expected = hf_model(input_ids=torch.tensor([ids]), pixel_values=pixels[None]).logits[0]
    torch.testing.assert_close(from_pair, expected, atol=HF_ATOL, rtol=0)


def test_the_pair_is_the_folders_model(loaded: Loaded) -> None:
    """Config, tokenizer, template and image processor from the two files are the folder's."""
    folder, pair = loaded.from_folder, loaded.from_pair
    assert type(pair.model) is type(folder.model)
    assert pair.arch.vision == folder.arch.vision
    assert _spec(pair) == _spec(folder)  # from the mmproj's keys / from preprocessor_config.json
    assert pair.tokenizer.chat_template == folder.tokenizer.chat_template
    assert pair.tokenizer.tokenizer.get_vocab() == folder.tokenizer.tokenizer.get_vocab()
    assert pair.tokenizer.bos_token_id == folder.tokenizer.bos_token_id
    assert pair.tokenizer.add_bos_token is folder.tokenizer.add_bos_token is False
    # The folder's <end_of_utterance> stop comes from generation_config.json, the GGUF's by its name.
    assert set(pair.tokenizer.eos_token_ids) == set(folder.tokenizer.eos_token_ids)


def test_mmproj_layout_is_llama_cpps(loaded: Loaded) -> None:
    """The names, shapes and keys llama.cpp's clip.cpp reads; the patch embedding a 4-D f32 kernel."""
    reader = gguf.GGUFReader(loaded.pair.mmproj)
    tensors = {t.name: t for t in reader.tensors}
    assert str(bytes(reader.fields["clip.projector_type"].parts[-1]), "utf-8") == "idefics3"
    assert str(bytes(reader.fields["general.type"].parts[-1]), "utf-8") == "mmproj"
    patch = tensors["v.patch_embd.weight"]
    assert (list(patch.shape), patch.tensor_type) == ([8, 8, 3, 32], Q.F32)  # ggml's order
    assert list(tensors["mm.model.fc.weight"].shape) == [128, 64]
    assert {
        "v.position_embd.weight",
        "v.blk.1.attn_q.weight",
        "v.blk.1.ffn_down.bias",
        "v.post_ln.weight",
    } <= tensors.keys()
    assert int(reader.fields["clip.vision.projector.scale_factor"].parts[-1][0]) == 2
    assert int(reader.fields["clip.vision.preproc_image_size"].parts[-1][0]) == 64
    # The language file says it adds no BOS (llama.cpp would add one to a gpt2 vocabulary otherwise).
    assert read_gguf(loaded.pair.language).metadata["tokenizer.ggml.add_bos_token"] is False


def _vision_tensors(folder: Path, scale: float = 1.0) -> dict[str, torch.Tensor]:
    prefixes = ("model.vision_model.", "model.connector.")
    return {n: t * scale for n, t in iter_safetensors(folder) if n.startswith(prefixes)}


def _write_variant(
    loaded: Loaded, path: Path, *, text_hidden_size: int = 64, drop: str = "", scale: float = 1.0
) -> Path:
    arch = loaded.from_folder.arch
    assert arch.vision is not None
    tensors = {n: t for n, t in _vision_tensors(loaded.folder, scale).items() if n != drop}
    processor = _spec(loaded.from_folder).processor
    write_mmproj(path, "variant", arch.vision, text_hidden_size, processor, tensors, "f32")
    return path


def test_another_mmproj_is_another_cache_key(loaded: Loaded, tmp_path: Path) -> None:
    """Image KV made with one projector is never reused with another: the fingerprint covers the
    vision weights; the same pair loads to the same key."""
    other = _write_variant(loaded, tmp_path / "mmproj-other.gguf", scale=1.5)
    with_other = load_model(loaded.pair.language, torch.float32, progress=False, mmproj=other)
    again = load_model(loaded.pair.language, torch.float32, progress=False, mmproj=loaded.pair.mmproj)
    text_only = load_model(loaded.pair.language, torch.float32, progress=False, mmproj="none")
    config = EngineConfig(dtype="float32", device="cpu")
    key = cache_key(config, loaded.from_pair.fingerprint)
    assert cache_key(config, again.fingerprint) == key
    assert cache_key(config, with_other.fingerprint) != key
    assert text_only.arch.vision is None and text_only.fingerprint != loaded.from_pair.fingerprint


def _write_other_projector(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    writer.add_tensor("mm.input_projection.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("variant", "error", "match"),
    [
        ("projector", UnsupportedModelError, "projector type 'gemma3' is not supported"),
        ("hidden", UnsupportedModelError, "language model of hidden size 32, but the model's is 64"),
        ("missing", CorruptModelFileError, r"1 tensors missing, e.g. \['v.blk.1.attn_k.weight'\]"),
    ],
)
def test_a_bad_mmproj_is_an_error_naming_it(
    loaded: Loaded, tmp_path: Path, variant: str, error: type, match: str
) -> None:
    path = tmp_path / f"mmproj-{variant}.gguf"
    if variant == "projector":
        _write_other_projector(path)
    else:
        hidden, drop = (
            (32, "")
            if variant == "hidden"
            else (64, "model.vision_model.encoder.layers.1.self_attn.k_proj.weight")
        )
        _write_variant(loaded, path, text_hidden_size=hidden, drop=drop)
    with pytest.raises(error, match=match) as raised:
        load_model(loaded.pair.language, torch.float32, progress=False, mmproj=path)
    assert str(path) in str(raised.value)


def test_the_mmproj_as_the_model_or_beside_a_folder_is_an_error(loaded: Loaded) -> None:
    with pytest.raises(UnsupportedModelError, match="pass the language GGUF as --model, this as --mmproj"):
        load_model(loaded.pair.mmproj, torch.float32, progress=False)
    with pytest.raises(UnsupportedModelError, match="--mmproj goes with a GGUF language model"):
        load_model(loaded.folder, torch.float32, progress=False, mmproj=loaded.pair.mmproj)
    with pytest.raises(ModelLoadError, match="no such mmproj file"):
        load_model(loaded.pair.language, torch.float32, progress=False, mmproj=loaded.folder / "nope.gguf")


def test_the_one_mmproj_beside_the_model_is_found(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = tmp_path / "model-F16.gguf"
    model.touch()
    assert find_mmproj(model, "auto") is None
    (tmp_path / "mmproj-model-F16.gguf").touch()
    with caplog.at_level(logging.INFO, logger="kvserve.models.loader.mmproj"):
        assert find_mmproj(model, "auto") == tmp_path / "mmproj-model-F16.gguf"
    assert "mmproj-model-F16.gguf (found beside the model; --no-mmproj to skip it)" in caplog.text
    assert find_mmproj(model, "none") is None and find_mmproj(model, None) is None
    shutil.copy(tmp_path / "mmproj-model-F16.gguf", tmp_path / "mmproj-model-Q8_0.gguf")
    with pytest.raises(UnsupportedModelError, match=r"several mmproj files .*pick one with --mmproj"):
        find_mmproj(model, "auto")
    assert find_mmproj(model, tmp_path / "mmproj-model-Q8_0.gguf") == tmp_path / "mmproj-model-Q8_0.gguf"


def test_auto_loads_the_pair_written_side_by_side(loaded: Loaded) -> None:
    auto = load_model(loaded.pair.language, torch.float32, progress=False, mmproj="auto")
    assert auto.fingerprint == loaded.from_pair.fingerprint


def test_an_f16_mmproj_keeps_the_embeddings_f32_and_the_logits_close(loaded: Loaded, tmp_path: Path) -> None:
    pair = write_gguf_pair(loaded.folder, tmp_path, outtype="f16")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(pair.mmproj).tensors}
    assert (types["v.patch_embd.weight"], types["v.position_embd.weight"]) == (Q.F32, Q.F32)
    assert (types["mm.model.fc.weight"], types["v.blk.0.attn_q.weight"], types["v.blk.0.ln1.weight"]) == (
        Q.F16,
        Q.F16,
        Q.F32,
    )
    # The f32 language file (its f16 twin is an ordinary llama GGUF) with the f16 projector.
    from_f16 = load_model(loaded.pair.language, torch.float32, progress=False, mmproj=pair.mmproj)
    images = [_image(50, 40, seed=0)]
    ids = _prompt_ids(loaded.from_folder, "TIT", images)
    pixels = _pixels(loaded.from_folder, images)
    expected = _our_logits(loaded.from_folder, ids, pixels)
    torch.testing.assert_close(_our_logits(from_f16, ids, pixels), expected, atol=F16_ATOL, rtol=0)


def test_a_language_model_without_image_tokens_is_an_error(loaded: Loaded, tmp_path: Path) -> None:
    """SmolLM2 alone (SmolVLM's decoder before the image tokens were added) with a projector of its
    hidden size."""
    from kvserve.models.aliases import _smollm2_path

    smollm2 = _smollm2_path()
    assert smollm2 is not None
    arch = loaded.from_folder.arch
    assert arch.vision is not None
    tensors = _vision_tensors(loaded.folder)
    tensors["model.connector.modality_projection.proj.weight"] = torch.zeros(576, 128)
    path = tmp_path / "mmproj-576.gguf"
    write_mmproj(path, "576", arch.vision, 576, _spec(loaded.from_folder).processor, tensors, "f32")
    with pytest.raises(
        UnsupportedModelError, match=f"no <image> token in its vocabulary for the images of {path}"
    ):
        load_model(smollm2, torch.float32, progress=False, mmproj=path)


def test_an_unsupported_projector_found_beside_the_model_leaves_it_serving_text(
    loaded: Loaded, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only what was found, not asked for: `--mmproj FILE` with it is an error (above)."""
    language = tmp_path / loaded.pair.language.name
    shutil.copy(loaded.pair.language, language)
    _write_other_projector(tmp_path / "mmproj-other.gguf")
    with caplog.at_level(logging.WARNING, logger="kvserve.models.loader.load"):
        text_only = load_model(language, torch.float32, progress=False, mmproj="auto")
    assert text_only.arch.vision is None
    assert "projector type 'gemma3' is not supported" in caplog.text and "without images" in caplog.text
