"""Images in all three APIs, through the official SDKs: decoded and validated at the edge, each
mistake a 400 in the protocol's own shape, images inside tool results carried into the
conversation, and text-only models refusing images by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from kvserve.chat.conversation import ChatRequest, ImagePart, ToolResultPart
from kvserve.chat.image_limits import ImageLimits
from tests.api.conftest import MODEL, Harness, make_harness
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.image_samples import b64, encoded, picture, png, png_header, two_frame_gif

# ChatML that writes each image as a placeholder (the FakeEngine never sees pixels).
VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<image>{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGES = {
    "png": ("image/png", png()),
    "jpeg": ("image/jpeg", encoded(picture(), "JPEG")),
    "webp": ("image/webp", encoded(picture(), "WEBP")),
    "gif": ("image/gif", two_frame_gif()),
}
# (media type, base64 data, what the error message says)
BAD_IMAGES = {
    "truncated": ("image/png", b64(png()[:60]), "could not be decoded"),
    "bomb": ("image/png", b64(png_header(30000, 30000)), "too many pixels"),
    "zero bytes": ("image/png", "", "empty"),
    "bad base64": ("image/png", "iVBOR*w0KGgo!", "base64"),
    "wrong media type": ("image/jpeg", b64(png()), "media type is image/jpeg but its data is PNG"),
    "not an image": ("text/plain", b64(b"hello"), "unsupported image media type"),
}
TOOL = {"name": "screenshot", "description": "", "input_schema": {"type": "object", "properties": {}}}


class Vision:
    """A harness whose model takes images, recording each ChatRequest that reaches the service."""

    def __init__(self, **api_settings: Any):
        tokenizer = FakeTokenizerInfo(chat_template=VISION_TEMPLATE)
        self.h = make_harness(
            FakeEngine(reply("ok")),
            tokenizer=tokenizer,
            chat_settings={"supports_images": True},
            **api_settings,
        )
        self.requests: list[ChatRequest] = []
        render = self.h.service.render

        def recording(request: ChatRequest) -> str:
            self.requests.append(request)
            return render(request)

        self.h.service.render = recording  # type: ignore[method-assign]

    def prompt(self) -> str:
        return self.h.service.detokenize(self.h.engine.requests[-1][0])


@pytest.fixture
async def vision() -> AsyncIterator[Vision]:
    v = Vision()
    yield v
    await v.h.http.aclose()


def chat_image(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}


def anthropic_image(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def responses_image(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": f"data:{media_type};base64,{data}"}


# -- accepted --------------------------------------------------------------------------------


async def test_models_listing_reports_vision(vision: Vision) -> None:
    entry = (await vision.h.http.get("/v1/models")).json()["data"][0]
    assert entry["modalities"] == {"vision": True, "audio": False}  # llama-server's /props shape


@pytest.mark.parametrize("kind", IMAGES)
async def test_every_format_passes_in_every_api(vision: Vision, kind: str) -> None:
    media_type, data = IMAGES[kind]
    text = {"type": "text", "text": "what is this?"}
    await vision.h.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [text, chat_image(media_type, b64(data))]}]
    )
    await vision.h.anthropic.messages.create(
        model=MODEL,
        max_tokens=5,
        messages=[{"role": "user", "content": [text, anthropic_image(media_type, b64(data))]}],
    )
    await vision.h.openai.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "what?"}, responses_image(media_type, b64(data))],
            }
        ],
    )
    images = [m.images[0].image for r in vision.requests for m in r.messages if m.has_images]
    assert len(images) == 3 and len({i.content_hash for i in images}) == 1
    assert {(i.media_type, i.width, i.height) for i in images} == {(media_type, 32, 24)}
    assert "what?<image><|im_end|>" in vision.prompt()


async def test_tool_result_images_in_every_api(vision: Vision) -> None:
    shot, other = b64(png()), b64(encoded(picture(8, 8), "PNG"))
    await vision.h.anthropic.messages.create(
        model=MODEL,
        max_tokens=5,
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "look"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "two shots"},
                            anthropic_image("image/png", shot),
                            anthropic_image("image/png", other),
                        ],
                    }
                ],
            },
        ],
    )
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    await vision.h.openai.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [
                    {"type": "text", "text": "two shots"},
                    chat_image("image/png", shot),
                    chat_image("image/png", other),
                ],
            },
        ],
    )
    await vision.h.openai.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "look"},
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "two shots"},
                    responses_image("image/png", shot),
                    responses_image("image/png", other),
                ],
            },
        ],
    )
    assert len(vision.requests) == 3
    for request in vision.requests:
        tool = next(m for m in request.messages if m.role == "tool")
        result = tool.parts[0]
        assert isinstance(result, ToolResultPart) and result.content == "two shots"
        assert [type(p) for p in tool.parts[1:]] == [ImagePart, ImagePart]
        assert [(p.image.width, p.image.height) for p in tool.images] == [(32, 24), (8, 8)]
    # the template without tool support gets the results as a user turn, images included
    assert "two shots\n</tool_response><image><image><|im_end|>" in vision.prompt()


async def test_stored_responses_keep_their_images(vision: Vision) -> None:
    first = await vision.h.openai.responses.create(
        model=MODEL, input=[{"role": "user", "content": [responses_image("image/png", b64(png()))]}]
    )
    await vision.h.openai.responses.create(model=MODEL, input="and now?", previous_response_id=first.id)
    history = vision.requests[-1].messages
    assert history[0].images[0].image == vision.requests[0].messages[0].images[0].image
    assert vision.prompt().count("<image>") == 1


# -- refused ---------------------------------------------------------------------------------


async def _chat_error(h: Harness, content: list[dict[str, Any]]) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        await h.openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}])
    return info.value


async def _anthropic_error(h: Harness, content: list[dict[str, Any]]) -> anthropic.BadRequestError:
    with pytest.raises(anthropic.BadRequestError) as info:
        await h.anthropic.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": content}]
        )
    return info.value


async def _responses_error(h: Harness, content: list[dict[str, Any]]) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        await h.openai.responses.create(model=MODEL, input=[{"role": "user", "content": content}])
    return info.value


def _check_openai(error: openai.BadRequestError, param: str, words: str) -> None:
    body = error.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error" and body["param"] == param
    assert words in body["message"], body["message"]


def _check_anthropic(error: anthropic.BadRequestError, words: str) -> None:
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"], body["error"]["message"]


@pytest.mark.parametrize("case", BAD_IMAGES)
async def test_bad_images_are_400s_in_every_api(vision: Vision, case: str) -> None:
    media_type, data, words = BAD_IMAGES[case]
    text = {"type": "text", "text": "x"}
    error = await _chat_error(vision.h, [text, chat_image(media_type, data)])
    _check_openai(error, "messages.0.content.1", words)
    _check_anthropic(await _anthropic_error(vision.h, [text, anthropic_image(media_type, data)]), words)
    error = await _responses_error(vision.h, [responses_image(media_type, data)])
    _check_openai(error, "input.0.content.0", words)
    assert not vision.requests and not vision.h.engine.requests


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "/tmp/cat.png", "file:///tmp/cat.png"])
async def test_urls_and_paths_are_refused_saying_why(vision: Vision, url: str) -> None:
    why = "does not fetch URLs or read files"
    error = await _chat_error(vision.h, [{"type": "image_url", "image_url": {"url": url}}])
    _check_openai(error, "messages.0.content.0", why)
    error = await _responses_error(vision.h, [{"type": "input_image", "image_url": url}])
    _check_openai(error, "input.0.content.0", why)
    source = {"type": "url", "url": url}
    _check_anthropic(await _anthropic_error(vision.h, [{"type": "image", "source": source}]), why)


async def test_bad_image_inside_a_tool_result_names_its_place(vision: Vision) -> None:
    media_type, data, words = BAD_IMAGES["truncated"]
    with pytest.raises(openai.BadRequestError) as info:
        await vision.h.openai.responses.create(
            model=MODEL,
            input=[
                {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [responses_image(media_type, data)],
                },
            ],
        )
    _check_openai(info.value, "input.1.output.0", words)
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [anthropic_image(media_type, data)]}
    _check_anthropic(await _anthropic_error(vision.h, [result]), words)


async def test_limits_are_settings() -> None:
    v = Vision(image_limits=ImageLimits(max_images_per_request=2, max_image_pixels=32 * 24))
    image = chat_image("image/png", b64(png()))
    await v.h.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [image, image]}]
    )
    _check_openai(await _chat_error(v.h, [image, image, image]), "messages.0.content.2", "at most 2")
    # the count spans the whole request, tool results included
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [anthropic_image("image/png", b64(png()))],
    }
    error = await _anthropic_error(v.h, [result, anthropic_image("image/png", b64(png())), result])
    _check_anthropic(error, "at most 2 per request")
    big = responses_image("image/png", b64(png(33, 24)))
    _check_openai(await _responses_error(v.h, [big]), "input.0.content.0", "at most 768 are accepted")


async def test_default_allows_16_images(vision: Vision) -> None:
    small = chat_image("image/png", b64(png(4, 4)))
    await vision.h.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [small] * 16}]
    )
    _check_openai(await _chat_error(vision.h, [small] * 17), "messages.0.content.16", "at most 16")


# -- text-only models ------------------------------------------------------------------------


async def test_a_text_model_refuses_images_by_name(harness: Harness) -> None:
    good = b64(png())
    words = f"model {MODEL!r} does not accept image inputs"
    _check_openai(await _chat_error(harness, [chat_image("image/png", good)]), "messages", words)
    _check_anthropic(await _anthropic_error(harness, [anthropic_image("image/png", good)]), words)
    _check_openai(await _responses_error(harness, [responses_image("image/png", good)]), "input", words)
    assert not harness.engine.requests


async def test_a_text_model_validates_the_image_first(harness: Harness) -> None:
    media_type, data, words = BAD_IMAGES["truncated"]
    _check_openai(await _chat_error(harness, [chat_image(media_type, data)]), "messages.0.content.0", words)
    _check_anthropic(await _anthropic_error(harness, [anthropic_image(media_type, data)]), words)
