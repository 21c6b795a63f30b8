"""Images end to end through `kvserve serve`'s own wiring (in process) on tiny random-weight folders
of both vision families (SmolVLM / Idefics3; Qwen2.5-VL, whose image tokens take M-RoPE positions):
greedy answers equal transformers' on the same folder, later turns with images in
their history come from the prefix cache in all three APIs, a changed image is cached exactly up to
its first block, and hostile images get 4xx while every KV block returns to the pool."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import torch
from PIL import Image as PILImage

from tests.e2e.tiny_vlm_server import BLOCK, photo, serve_tiny_vlm, tiny_vlm_folder
from tests.image_samples import b64, encoded, picture, png, png_header
from tests.models.tiny_qwen_vl import hf_qwen_processor

SYSTEM = "You describe pictures. " + " ".join(f"Rule {i}: be exact about colour {i}." for i in range(40))


@pytest.fixture(scope="module", params=["smolvlm", "qwen2.5-vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm_folder(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)


def _is_qwen(folder: Path) -> bool:
    return '"qwen2_5_vl"' in (folder / "config.json").read_text()


def _hf_processor(folder: Path) -> Any:
    import transformers

    if _is_qwen(folder):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        return hf_qwen_processor(transformers.AutoImageProcessor.from_pretrained(folder), tokenizer)
    return transformers.AutoProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def url(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_tiny_vlm(folder, tmp_path_factory.mktemp("data")) as base:
        yield base


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + b64(data)


def _hf_greedy(folder: Path, images: list[bytes], text: str, max_new_tokens: int) -> str:
    """transformers' own processor and generate on the same folder: the oracle."""
    import io

    import transformers

    processor = _hf_processor(folder)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    messages = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": content},
    ]
    pil = [PILImage.open(io.BytesIO(data)).convert("RGB") for data in images]
    if _is_qwen(folder):
        prompt = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[prompt], images=pil, return_tensors="pt")
        model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        image_token = model.config.image_token_id
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == image_token).int()
    else:
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(text=prompt, images=[pil], return_tensors="pt")
        model = transformers.Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=False)


def _chat(url: str, images: list[bytes], text: str, history: list[dict[str, Any]] = (), **kw: Any) -> Any:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    content = [{"type": "image_url", "image_url": {"url": _uri(i)}} for i in images] + [
        {"type": "text", "text": text}
    ]
    messages = [{"role": "system", "content": SYSTEM}, *history, {"role": "user", "content": content}]
    return client.chat.completions.create(model="m", messages=messages, temperature=0, **kw)


def test_greedy_answer_equals_transformers(url: str, folder: Path) -> None:
    images = [photo(1), photo(2, 30, 50)]
    reply = _chat(url, images, "What is in these?", max_tokens=8, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == _hf_greedy(folder, images, "What is in these?", 8)


def test_second_turn_with_two_images_in_history_is_cached_in_all_three_apis(url: str) -> None:
    images, question = [photo(3), photo(4)], "Compare them."
    first = _chat(url, images, question, max_tokens=4)
    answer = first.choices[0].message.content
    history = [
        {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": _uri(i)}} for i in images),
                                     {"type": "text", "text": question}]},
        {"role": "assistant", "content": answer},
    ]  # fmt: skip
    second = _chat(url, [], "And the second one?", history=history, max_tokens=2)
    assert second.usage.prompt_tokens_details.cached_tokens >= 0.95 * second.usage.prompt_tokens

    claude = anthropic.Anthropic(base_url=url, api_key="x")
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(i)}}
        for i in images
    ]
    turn = [{"role": "user", "content": [*blocks, {"type": "text", "text": question}]}]
    claude.messages.create(model="m", system=SYSTEM, messages=turn, max_tokens=4)
    again = claude.messages.create(
        model="m", system=SYSTEM, max_tokens=2,
        messages=[*turn, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "More?"}],
    )  # fmt: skip
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert again.usage.cache_read_input_tokens >= 0.95 * total

    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    parts = [{"type": "input_image", "image_url": _uri(i)} for i in images]
    inputs = [{"role": "user", "content": [*parts, {"type": "input_text", "text": question}]}]
    oai.responses.create(model="m", instructions=SYSTEM, input=inputs, max_output_tokens=4, temperature=0)
    follow = oai.responses.create(
        model="m", instructions=SYSTEM, max_output_tokens=2, temperature=0,
        input=[*inputs, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "More?"}],
    )  # fmt: skip
    assert follow.usage.input_tokens_details.cached_tokens >= 0.95 * follow.usage.input_tokens


def test_a_changed_image_is_cached_exactly_up_to_its_first_block(url: str, folder: Path) -> None:
    text = "Look closely."
    _chat(url, [photo(5)], text, max_tokens=1)
    changed = _chat(url, [photo(6)], text, max_tokens=1)  # same size, other pixels
    processor = _hf_processor(folder)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]},
    ]
    if _is_qwen(folder):
        prompt = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = processor(text=[prompt], images=[PILImage.new("RGB", (48, 40))])["input_ids"][0]
        image_token = "<|image_pad|>"
    else:
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
        ids = processor(text=prompt, images=[[PILImage.new("RGB", (48, 40))]], return_tensors="pt")[
            "input_ids"
        ][0]
        ids, image_token = ids.tolist(), "<image>"
    first_image_token = list(ids).index(processor.tokenizer.convert_tokens_to_ids(image_token))
    assert changed.usage.prompt_tokens == len(ids)
    assert changed.usage.prompt_tokens_details.cached_tokens == first_image_token // BLOCK * BLOCK


def _hostile() -> list[tuple[str, str]]:
    """(media type, base64) of broken, oversized and mislabelled images, 200 in all."""
    good = png()
    variants = [
        ("image/png", b64(good[: len(good) // 2])),
        ("image/png", b64(png_header(30000, 30000))),
        ("image/png", ""),
        ("image/png", "iVBOR*w0KGgo!"),
        ("image/jpeg", b64(good)),
        ("text/plain", b64(b"hello")),
        ("image/jpeg", b64(encoded(picture(), "JPEG")[:40])),
        ("image/png", b64(png_header(0, 10))),
    ]
    return [variants[i % len(variants)] for i in range(200)]


def test_hostile_images_get_4xx_and_every_block_returns(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        for media_type, data in _hostile():
            body = {
                "model": "m",
                "max_tokens": 2,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}]}
                ],
            }  # fmt: skip
            status = http.post("/v1/chat/completions", json=body).status_code
            assert 400 <= status < 500, (media_type, data[:20], status)
        assert _chat(url, [photo(7)], "Still there?", max_tokens=2).choices[0].message.content is not None
        metrics = http.get("/metrics").text
    usage = re.search(r"^kvserve_kv_cache_usage(?:\{[^}]*\})? ([0-9.e+-]+)$", metrics, re.MULTILINE)
    assert usage is not None and float(usage.group(1)) == 0.0


def test_an_image_inside_a_tool_result_runs_and_its_next_turn_is_cached(url: str) -> None:
    """Claude Code's screenshot shape: the image comes back inside a tool_result block."""
    claude = anthropic.Anthropic(base_url=url, api_key="x")
    tool = {"name": "screenshot", "description": "Takes a screenshot.", "input_schema": {"type": "object"}}
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(photo(8))}}
    turns = [
        {"role": "user", "content": "Look at the screen."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [shot]}]},
    ]
    first = claude.messages.create(model="m", system=SYSTEM, tools=[tool], messages=turns, max_tokens=3)
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens > 100
    follow = [*turns, {"role": "assistant", "content": "I see it."}, {"role": "user", "content": "And now?"}]
    again = claude.messages.create(model="m", system=SYSTEM, tools=[tool], messages=follow, max_tokens=2)
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert again.usage.cache_read_input_tokens >= 0.95 * total


def test_after_a_restart_the_image_turn_comes_from_the_disk_tier(folder: Path, tmp_path: Path) -> None:
    """The same conversation sent to a restarted server over the same KV directory: its prompt,
    images included, is served from disk (>= 90%), not prefilled again."""
    extra = ["--kv-cache-dir", str(tmp_path / "kv")]
    images, question = [photo(9), photo(10, 40, 30)], "Describe both."
    with serve_tiny_vlm(folder, tmp_path / "data", extra) as base:
        first = _chat(base, images, question, max_tokens=2)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
    with serve_tiny_vlm(folder, tmp_path / "data", extra) as base:
        again = _chat(base, images, question, max_tokens=2)
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens
