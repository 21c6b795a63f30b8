"""llama.cpp's pair of files through `kvserve serve`'s own wiring (in process), for both vision families:
a tiny SmolVLM or Qwen2.5-VL folder written as a language GGUF + mmproj (loader/gguf_export.py),
served with `--model lang.gguf` alone (the mmproj beside it is taken), answers two images greedily as
transformers does on the folder; `--no-mmproj` serves the text model, which refuses images, and so
does a projector kvserve cannot run found beside it (with a warning). llama.cpp's own llama-server
(where built) loads the pair and answers an image on it: the files are its format, not only ours."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from kvserve.models.loader.gguf_export import GGUFPair, write_gguf_pair
from tests.e2e.test_vision_real import _chat, _hf_greedy
from tests.e2e.tiny_vlm_server import photo, tiny_vlm_folder
from tests.models.test_mmproj import _write_other_projector
from tests.serve_process import in_process_server


@pytest.fixture(scope="module", params=["smolvlm", "qwen2.5-vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny folder of the family (skipped without SmolLM2's tokenizer)."""
    return tiny_vlm_folder(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)


@pytest.fixture(scope="module")
def pair(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> GGUFPair:
    # Both tiny folders borrow SmolLM2's vocabulary, which llama.cpp names "smollm".
    return write_gguf_pair(folder, tmp_path_factory.mktemp("gguf"), tokenizer_pre="smollm")


@contextmanager
def _serve(model: Path, data_dir: Path, *extra: str) -> Iterator[str]:
    args = ["--model", str(model), "--device", "cpu", "--ctx", "2048", "--generation-config", "none"]
    with in_process_server([*args, "--data-dir", str(data_dir), *extra]) as base:
        yield base


@pytest.fixture(scope="module")
def url(pair: GGUFPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _serve(pair.language, tmp_path_factory.mktemp("data")) as base:
        yield base


def test_the_pair_answers_as_transformers_on_the_folder(url: str, folder: Path) -> None:
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["modalities"]["vision"] is True
    images = [photo(1), photo(2, 30, 50)]
    reply = _chat(url, images, "What is in these?", max_tokens=8, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == _hf_greedy(folder, images, "What is in these?", 8)


def _serves_text_only(url: str) -> None:
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["modalities"]["vision"] is False
    with pytest.raises(openai.BadRequestError, match="image"):
        _chat(url, [photo(3)], "What is this?", max_tokens=2)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    text = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert text.usage.completion_tokens == 2


def test_no_mmproj_serves_the_text_model(pair: GGUFPair, tmp_path: Path) -> None:
    with _serve(pair.language, tmp_path, "--no-mmproj") as url:
        _serves_text_only(url)


def test_a_projector_it_cannot_run_found_beside_it_serves_text(
    pair: GGUFPair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    language = Path(shutil.copy(pair.language, tmp_path / pair.language.name))
    _write_other_projector(tmp_path / "mmproj-other.gguf")
    with caplog.at_level(logging.WARNING), _serve(language, tmp_path / "data") as url:
        _serves_text_only(url)
    assert "projector type 'gemma3' is not supported" in caplog.text and "without images" in caplog.text


def test_llama_server_answers_an_image_on_the_pair(pair: GGUFPair, tmp_path: Path) -> None:
    from kvserve.bench.llama_server import find_llama_server
    from kvserve.bench.peers import ServerKind, ServerProcess, ServerSpec

    binary = find_llama_server()
    if binary is None:
        pytest.skip("the C++ llama-server is not built (make bench-peer)")
    spec = ServerSpec(
        "llama-server", ServerKind.LLAMA_SERVER, str(pair.language), ctx=2048, threads=1,
        extra_args=("--mmproj", str(pair.mmproj)), executable=str(binary), has_chat_template=True,
    )  # fmt: skip
    with ServerProcess(spec, log_dir=tmp_path) as server:
        reply = _chat(server.url, [photo(1)], "What is this?", max_tokens=2)
        text_only = _chat(server.url, [], "What is this?", max_tokens=2)
    assert reply.usage.completion_tokens == 2
    # The image's tokens (however llama.cpp sizes it: it keeps its own pixel bounds) are in the prompt.
    assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + 4
    assert "loaded multimodal model" in server.log_path.read_text()
