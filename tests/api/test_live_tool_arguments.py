"""Tool-call arguments stream live on every API's wire (ref `openai_tool_stream_sends_partial_arguments`,
`anthropic_tool_stream_sends_live_tool_use`): the FakeEngine samples one byte per token, so a long
argument reaches the client in several fragments that add up to the final arguments, with no markup
and no broken UTF-8 (a multi-byte character arrives as several byte tokens)."""

from __future__ import annotations

import json

import pytest

from kvserve.serving.segmenter import OutputSyntax
from tests.api.conftest import Harness, make_harness
from tests.api.fake_engine import FakeEngine, reply

COMMAND = "echo partial output, then some more && echo done — café 😀"
_D = "｜DSML｜"
OUTPUTS = {
    "hermes": f'Running it.\n<tool_call>\n{{"name": "bash", "arguments": {json.dumps({"cmd": COMMAND})}}}\n</tool_call>',
    "deepseek_dsml": (
        f'Running it.\n\n<{_D}tool_calls>\n<{_D}invoke name="bash">\n'
        f'<{_D}parameter name="cmd" string="true">{COMMAND}</{_D}parameter>\n</{_D}invoke>\n</{_D}tool_calls>'
    ),
    "qwen3_coder": (
        f"Running it.\n<tool_call>\n<function=bash>\n<parameter=cmd>\n{COMMAND}\n</parameter>\n</function>\n</tool_call>"
    ),
}
SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
ARGUMENTS = {"cmd": COMMAND}
SYNTAXES = sorted(OUTPUTS)


def _harness(syntax: str) -> Harness:
    return make_harness(
        FakeEngine(reply(OUTPUTS[syntax])), segmenter_factory=OutputSyntax(syntax, None).segmenter
    )


def _check(fragments: list[str]) -> None:
    assert len(fragments) >= 3, fragments  # several fragments, not one at the end
    assert all(fragments) and "\ufffd" not in "".join(fragments)
    assert not any("<" in f and ">" in f for f in fragments)  # no markup on the wire
    assert json.loads("".join(fragments)) == ARGUMENTS


@pytest.mark.parametrize("syntax", SYNTAXES)
async def test_openai_chat_streams_argument_fragments(syntax: str) -> None:
    h = _harness(syntax)
    stream = await h.openai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Run it"}],
        tools=[{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}],
        stream=True,
    )
    ids, names, fragments, content, finish = set(), [], [], "", None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                if delta.id:
                    ids.add(delta.id)
                    assert delta.function.name == "bash" and not delta.function.arguments  # header first
                    names.append(delta.function.name)
                elif delta.function.arguments:
                    fragments.append(delta.function.arguments)
    assert len(ids) == 1 and names == ["bash"] and content == "Running it." and finish == "tool_calls"
    _check(fragments)
    await h.http.aclose()


@pytest.mark.parametrize("syntax", SYNTAXES)
async def test_anthropic_streams_input_json_deltas(syntax: str) -> None:
    h = _harness(syntax)
    stream = await h.anthropic.messages.create(
        model="m",
        max_tokens=500,
        messages=[{"role": "user", "content": "Run it"}],
        tools=[{"name": "bash", "input_schema": SCHEMA}],
        stream=True,
    )
    fragments, starts, stop = [], [], None
    async for event in stream:
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            starts.append(event.content_block)
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            fragments.append(event.delta.partial_json)
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    (start,) = starts
    assert start.name == "bash" and start.id.startswith("toolu_") and stop == "tool_use"
    _check(fragments)
    await h.http.aclose()


@pytest.mark.parametrize("syntax", SYNTAXES)
async def test_responses_streams_function_call_arguments_deltas(syntax: str) -> None:
    h = _harness(syntax)
    stream = await h.openai.responses.create(
        model="m",
        input="Run it",
        tools=[{"type": "function", "name": "bash", "parameters": SCHEMA}],
        stream=True,
    )
    fragments, done, final = [], [], None
    async for event in stream:
        if event.type == "response.function_call_arguments.delta":
            fragments.append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            done.append(event.arguments)
        elif event.type == "response.completed":
            final = event.response
    _check(fragments)
    assert done == ["".join(fragments)]
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "bash" and call.arguments == done[0]
    await h.http.aclose()
