"""Chat template rendering with HF semantics, without transformers."""

from __future__ import annotations

import pytest

from kvserve.chat.conversation import (
    ChatRequest,
    ImagePart,
    Message,
    ReasoningControl,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
)
from kvserve.chat.image import decode_data_uri
from kvserve.chat.image_limits import ImageLimits
from kvserve.chat.render import CHATML_TEMPLATE, ChatRenderer, ChatTemplateError
from tests.image_samples import b64, png
from tests.models.tiny_vlm import SMOLVLM_TEMPLATE

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Qwen-style template exercising tools, tool calls, tojson, raise_exception and bos_token.
TOOLS_TEMPLATE = """{{ bos_token }}
{%- if tools %}<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
{% endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role') }}{% endif %}
<{{ message.role }}>{{ message.content }}
{%- if message.tool_calls %}{% for call in message.tool_calls %}<call id="{{ call.id }}">{{ call.function.arguments | tojson }}</call>{% endfor %}{% endif %}
{%- if message.role == 'tool' %}[{{ message.tool_call_id }}/{{ message.name }}]{% endif %}
{%- if message.reasoning_content %}(r:{{ message.reasoning_content }}){% endif %}
</{{ message.role }}>
{% endfor %}
{%- if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}{% endif %}"""


def _user(text: str) -> Message:
    return Message("user", (TextPart(text),))


def test_smollm2_template_matches_hf_output() -> None:
    renderer = ChatRenderer(SMOLLM2)
    text = renderer.render(ChatRequest(messages=(_user("Hi"),)))
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_text_parts_are_joined_and_generation_prompt_is_optional() -> None:
    renderer = ChatRenderer(CHATML_TEMPLATE)
    msg = Message("user", (TextPart("a"), TextPart("b")))
    assert renderer.render(ChatRequest(messages=(msg,)), add_generation_prompt=False) == (
        "<|im_start|>user\nab<|im_end|>\n"
    )


def test_missing_template_falls_back_to_chatml() -> None:
    assert ChatRenderer(None).render(ChatRequest(messages=(_user("x"),))).endswith("<|im_start|>assistant\n")


def test_tools_tool_calls_and_results_reach_the_template() -> None:
    renderer = ChatRenderer(TOOLS_TEMPLATE, {"bos_token": "<s>"})
    tool = ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    messages = (
        _user("Weather in Paris?"),
        Message(
            "assistant", (ReasoningPart("think"), ToolCallPart("c1", "get_weather", '{"city": "Paris"}'))
        ),
        Message("tool", (ToolResultPart("c1", "sunny"),)),
    )
    text = renderer.render(
        ChatRequest(messages=messages, tools=(tool,), reasoning=ReasoningControl(enabled=False))
    )
    assert text.startswith("<s><tools>\n")
    assert '"name": "get_weather"' in text and "é" not in text
    assert '<call id="c1">{"city": "Paris"}</call>' in text
    assert "(r:think)" in text
    assert "<tool>sunny[c1/get_weather]" in text
    assert text.endswith("<assistant><nothink>")


def test_tool_choice_none_renders_no_tools() -> None:
    renderer = ChatRenderer(TOOLS_TEMPLATE, {"bos_token": ""})
    request = ChatRequest(messages=(_user("x"),), tools=(ToolSpec("f"),), tool_choice="none")
    assert "<tools>" not in renderer.render(request)


def test_tojson_keeps_non_ascii_and_key_order() -> None:
    renderer = ChatRenderer("{{ tools | tojson }}")
    tool = ToolSpec("f", "é", {"z": 1, "a": 2})
    out = renderer.render(ChatRequest(messages=(), tools=(tool,)))
    assert '"description": "é"' in out and out.index('"z"') < out.index('"a"')


def test_raise_exception_becomes_a_typed_error() -> None:
    renderer = ChatRenderer("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        renderer.render(ChatRequest(messages=(_user("x"),)))


def test_template_type_errors_become_typed_errors() -> None:
    renderer = ChatRenderer("{{ messages[0]['content'] + 1 }}")
    with pytest.raises(ChatTemplateError):
        renderer.render(ChatRequest(messages=(_user("x"),)))


def test_sandbox_blocks_attribute_escapes() -> None:
    renderer = ChatRenderer("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        renderer.render(ChatRequest(messages=(_user("x"),)))


def test_strftime_now_and_generation_tag() -> None:
    renderer = ChatRenderer("{% generation %}{{ strftime_now('%Y') }}{% endgeneration %}")
    assert renderer.render(ChatRequest(messages=())).isdigit()


def test_a_vision_template_gets_every_content_as_parts() -> None:
    """SmolVLM's template iterates each message's content as parts: a plain string renders as
    nothing (HF's processor drops such text), so text-only messages go in as one text part."""

    image = decode_data_uri("data:image/png;base64," + b64(png()), ImageLimits())
    renderer = ChatRenderer(SMOLVLM_TEMPLATE)
    assert renderer.content_as_parts and not ChatRenderer(SMOLLM2).content_as_parts
    messages = (
        Message("system", (TextPart("Be brief."),)),
        Message("user", (ImagePart(image), TextPart("What is this?"))),
        Message("assistant", (TextPart("A square."),)),
        _user("Sure?"),
    )
    assert renderer.render(ChatRequest(messages=messages)) == (
        "<|im_start|>System: Be brief.<end_of_utterance>\nUser:<image>What is this?<end_of_utterance>\n"
        "Assistant: A square.<end_of_utterance>\nUser: Sure?<end_of_utterance>\nAssistant:"
    )
