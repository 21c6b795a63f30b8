"""Images and tool calls in one history, through `kvserve serve`'s own wiring (in process) on a tiny
random-weight SmolVLM folder: exact tool replay hits the cache across an image and the replayed call,
an image inside a tool result is cached on its turn and the next (Chat, Anthropic, Responses), and
the console's divergence view points at the first token of an image whose pixels changed (against
an earlier request, and after a restart against the disk checkpoint)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from PIL import Image as PILImage

from tests.e2e.tiny_vlm_server import BLOCK, photo, serve_tiny_vlm, tiny_vlm_folder
from tests.e2e.tool_turns import chat_call_turn, whole_turn
from tests.image_samples import b64

SYSTEM = "You look at pictures and call tools. " + " ".join(f"Rule {i}: check colour {i}." for i in range(30))
# A bounded argument (an enum), so the random model's forced call closes well within max_tokens.
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
RESULT = '{"forecast": "sunny, 24C"}'


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm_folder(tmp_path_factory.mktemp("tiny-smolvlm"))


@pytest.fixture(scope="module")
def url(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_tiny_vlm(folder, tmp_path_factory.mktemp("data")) as base:
        yield base


def _image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(data)}}


def _whole_turn(prompt_tokens: int, output_tokens: int) -> int:
    return whole_turn(prompt_tokens, output_tokens, BLOCK)


def _reordered_call(call: Any) -> dict[str, Any]:
    """The assistant turn a client sends back: arguments re-serialized, never the sampled bytes."""
    return chat_call_turn(call, json.dumps(json.loads(call.function.arguments), separators=(",", ":")))


def _forced_call(oai: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    first = oai.chat.completions.create(
        model="m", messages=messages, tools=CHAT_TOOLS, tool_choice=FORCED, max_tokens=40, temperature=0
    )
    assert first.choices[0].finish_reason == "tool_calls", first.choices[0]
    return first


def test_tool_turn_after_an_image_is_cached_across_the_image_and_the_replayed_call(url: str) -> None:
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    user = {
        "role": "user",
        "content": [_image_part(photo(1)), {"type": "text", "text": "Weather where this is?"}],
    }
    messages = [{"role": "system", "content": SYSTEM}, user]
    first = _forced_call(oai, messages)
    call = first.choices[0].message.tool_calls[0]
    tool = {"role": "tool", "tool_call_id": call.id, "content": RESULT}
    second = oai.chat.completions.create(
        model="m",
        messages=[*messages, _reordered_call(call), tool],
        tools=CHAT_TOOLS,
        max_tokens=2,
        temperature=0,
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= _whole_turn(first.usage.prompt_tokens, first.usage.completion_tokens)


def test_an_image_in_a_chat_tool_result_is_cached_on_the_next_turn(url: str) -> None:
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Take a look at the sky, then tell me the weather."},
    ]
    first = _forced_call(oai, messages)
    call = first.choices[0].message.tool_calls[0]
    shot = {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": RESULT}, _image_part(photo(2))]}  # fmt: skip
    messages += [_reordered_call(call), shot]
    second = oai.chat.completions.create(
        model="m", messages=messages, tools=CHAT_TOOLS, max_tokens=3, temperature=0
    )
    assert second.usage.prompt_tokens_details.cached_tokens >= _whole_turn(
        first.usage.prompt_tokens, first.usage.completion_tokens
    )
    messages += [{"role": "assistant", "content": second.choices[0].message.content}, {"role": "user", "content": "And now?"}]  # fmt: skip
    third = oai.chat.completions.create(
        model="m", messages=messages, tools=CHAT_TOOLS, max_tokens=2, temperature=0
    )
    assert third.usage.prompt_tokens_details.cached_tokens >= _whole_turn(
        second.usage.prompt_tokens, second.usage.completion_tokens
    )


def test_an_image_in_an_anthropic_tool_result_continues_the_calling_turn(url: str) -> None:
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather of a city.", "input_schema": WEATHER}]
    question = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(photo(3))}}, {"type": "text", "text": "Weather there?"}]}  # fmt: skip
    first = claude.messages.create(
        model="m", system=SYSTEM, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question], max_tokens=40,
    )  # fmt: skip
    use = next(block for block in first.content if block.type == "tool_use")
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(photo(4))}}
    turns = [
        question,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": RESULT}, shot]}]},
    ]  # fmt: skip
    second = claude.messages.create(model="m", system=SYSTEM, tools=tools, messages=turns, max_tokens=3)
    first_total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= _whole_turn(first_total, first.usage.output_tokens)
    answer = [{"type": "text", "text": "".join(b.text for b in second.content if b.type == "text") or "Ok."}]
    turns += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And now?"}]
    third = claude.messages.create(model="m", system=SYSTEM, tools=tools, messages=turns, max_tokens=2)
    second_total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert third.usage.cache_read_input_tokens >= _whole_turn(second_total, second.usage.output_tokens)


def test_a_text_only_anthropic_tool_turn_and_the_turn_after_it_are_cached(url: str) -> None:
    """The same template mismatch without images: the results' turn continues the live sequence,
    and so does the turn after it (which re-rendering alone would cut at the call)."""
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather of a city.", "input_schema": WEATHER}]
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Rome, please?"}]
    first = claude.messages.create(
        model="m", system=SYSTEM, tools=tools, tool_choice={"type": "any"}, messages=turns, max_tokens=40
    )
    use = next(block for block in first.content if block.type == "tool_use")
    turns += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]},
    ]  # fmt: skip
    second = claude.messages.create(model="m", system=SYSTEM, tools=tools, messages=turns, max_tokens=3)
    first_total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= _whole_turn(first_total, first.usage.output_tokens)
    turns += [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Tomorrow?"}]
    third = claude.messages.create(model="m", system=SYSTEM, tools=tools, messages=turns, max_tokens=2)
    second_total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert third.usage.cache_read_input_tokens >= second_total // BLOCK * BLOCK


def test_responses_image_then_call_then_an_image_output_is_cached(url: str) -> None:
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    image = {"type": "input_image", "image_url": "data:image/png;base64," + b64(photo(9))}
    question = {"role": "user", "content": [image, {"type": "input_text", "text": "Weather there?"}]}
    first = oai.responses.create(
        model="m", instructions=SYSTEM, input=[question], tools=tools, store=False,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40, temperature=0,
    )  # fmt: skip
    call = next(item for item in first.output if item.type == "function_call")
    shot = {"type": "input_image", "image_url": "data:image/png;base64," + b64(photo(10))}
    output = [{"type": "input_text", "text": RESULT}, shot]
    second = oai.responses.create(
        model="m", instructions=SYSTEM, tools=tools, store=False, max_output_tokens=2, temperature=0,
        input=[
            question,
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": output},
        ],
    )  # fmt: skip
    assert second.usage.input_tokens_details.cached_tokens >= _whole_turn(
        first.usage.input_tokens, first.usage.output_tokens
    )


def test_the_divergence_view_points_at_the_first_token_of_a_changed_image(url: str, folder: Path) -> None:
    text = "Weather where this is?"
    with httpx.Client(base_url=url, timeout=120) as http:

        def send(image: bytes, request_id: str) -> dict[str, Any]:
            content = [{"type": "text", "text": text}, _image_part(image)]
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
            body = {"model": "m", "messages": messages, "max_tokens": 1, "temperature": 0}
            response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": request_id})
            assert response.status_code == 200, response.text
            return response.json()

        send(photo(5), "div-a")
        changed = send(photo(6), "div-b")  # same size, other pixels: the same token ids
        records = http.get("/kvserve/v1/requests", params={"limit": 50}).json()["recent"]
    record = next(r for r in records if r["request_id"].startswith("div-b"))
    image_token = _first_image_token(folder, text)
    assert changed["usage"]["prompt_tokens"] == record["num_prompt_tokens"]
    assert record["num_cached_tokens"] == image_token // BLOCK * BLOCK
    divergence = record["divergence"]
    assert divergence is not None and divergence["reference_id"].startswith("div-a"), divergence
    assert divergence["token_index"] == image_token, divergence


def test_after_a_restart_the_divergence_from_the_checkpoint_is_at_the_changed_image(
    folder: Path, tmp_path: Path
) -> None:
    """A restarted server's only reference is the disk checkpoint, whose tokens carry no images."""
    text = "Weather where this is?"
    system = SYSTEM * 2  # long enough that the first turn is kept on disk

    def send(base: str, image: bytes) -> dict[str, Any]:
        content = [{"type": "text", "text": text}, _image_part(image)]
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
        }
        response = httpx.post(f"{base}/v1/chat/completions", json={**body, "max_tokens": 1}, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    extra = ["--kv-cache-dir", str(tmp_path / "kv"), "--no-kv-cache-preload"]  # a disk hit, not RAM
    with serve_tiny_vlm(folder, tmp_path / "data", extra) as base:
        send(base, photo(7))
    with serve_tiny_vlm(folder, tmp_path / "data", extra) as base:
        send(base, photo(8))  # same size, other pixels
        (record,) = httpx.get(f"{base}/kvserve/v1/requests").json()["recent"]
    image_token = _first_image_token(folder, text, system)
    assert record["source"] == "disk" and 0 < record["num_cached_tokens"] <= image_token  # whole chunks
    divergence = record["divergence"]
    assert divergence is not None and divergence["reference_kind"] == "checkpoint", divergence
    assert divergence["token_index"] == image_token, divergence


def _first_image_token(folder: Path, text: str, system: str = SYSTEM) -> int:
    """Index of the first `<image>` token of the divergence test's prompt, by transformers' processor."""
    import transformers

    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]},
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    ids = processor(text=prompt, images=[[PILImage.new("RGB", (48, 40))]], return_tensors="pt")["input_ids"][
        0
    ]
    return ids.tolist().index(processor.tokenizer.convert_tokens_to_ids("<image>"))
