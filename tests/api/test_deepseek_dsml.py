"""DeepSeek DSML end to end: a tiny random model with DeepSeek's special tokens and a DSML chat
template (tests/models/deepseek.py).

The parsing half scripts the model's output (FakeEngine) through the real tokenizer, render and
output path: tools block, reasoning opened by the prompt, DSML calls with entities and JSON values,
exact replay and live continuation. The loading half serves the real tiny model with `kvserve serve`'s
own composition (`build_app`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.chat.tools import tools_from_anthropic, tools_from_responses
from kvserve.models.loader.tokenizer import load_hf_tokenizer
from kvserve.serving.live_sequences import LiveSequences
from kvserve.serving.segmenter import OutputSyntax
from kvserve.serving.tool_memory import ToolReplayMemory
from tests.api.conftest import Harness, make_harness
from tests.api.fake_engine import FakeEngine
from tests.live_uvicorn import serve_in_thread
from tests.models.deepseek import ASSISTANT, BOS, EOS, USER, save_deepseek_tokenizer, save_tiny_deepseek_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
BLOCK = (
    "\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris & <Lyon></｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)
# The prompt ends inside `<think>`: the model writes only the closing tag.
OUTPUT = "Weather needs a lookup.</think>Checking." + BLOCK
ANSWER = "</think>Sunny."
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deepseek-tokenizer")
    save_deepseek_tokenizer(path)
    return path


@pytest.fixture
async def h(tokenizer_dir: Path):
    info = load_hf_tokenizer(tokenizer_dir)
    (eos_id,) = info.eos_token_ids

    def script(prompt: list[int]) -> list[int]:
        text = info.tokenizer.decode(prompt, skip_special_tokens=False)
        return info.tokenizer.encode(ANSWER if "<tool_result>" in text else OUTPUT) + [eos_id]

    syntax = OutputSyntax.detect(info.chat_template)
    assert syntax.tool_parser == "deepseek_dsml" and syntax.reasoning is not None
    harness = make_harness(
        FakeEngine(script, eos_token_id=eos_id),
        segmenter_factory=syntax.segmenter,
        tokenizer=info,
        service_options={"tool_memory": ToolReplayMemory(), "live_sequences": LiveSequences()},
    )
    yield harness
    await harness.http.aclose()


def _text(h: Harness, tokens: list[int]) -> str:
    return h.service.detokenize(tokens)


def _turn1(h: Harness) -> list[int]:
    """The first request's prompt and the tokens it sampled."""
    return h.engine._history[0]


async def test_dsml_call_from_a_prompt_opened_reasoning_block(h: Harness) -> None:
    response = await h.openai.chat.completions.create(model="m", messages=QUESTION, tools=OPENAI_TOOLS)
    message = response.choices[0].message
    assert message.reasoning_content == "Weather needs a lookup." and message.content == "Checking."
    (call,) = message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris & <Lyon>", "days": 3}
    assert response.choices[0].finish_reason == "tool_calls"
    prompt = _text(h, h.engine.requests[0][0])
    assert prompt.startswith(BOS + "## Tools\n\n") and prompt.endswith(
        f"{USER}Weather in Paris?{ASSISTANT}<think>"
    )
    assert '{"name": "get_weather", "description": "", "parameters": {"type": "object"' in prompt


async def test_thinking_off_renders_a_closed_block_and_output_is_content(h: Harness) -> None:
    eos_id = h.engine.eos_token_id
    h.engine.script = lambda prompt: h.service.tokenize("Sunny.", False) + [eos_id]
    response = await h.openai.chat.completions.create(
        model="m", messages=QUESTION, extra_body={"thinking": {"type": "disabled"}}
    )
    assert response.choices[0].message.content == "Sunny."
    assert _text(h, h.engine.requests[0][0]).endswith(f"{ASSISTANT}</think>")


def _spell_think_in_bytes(h: Harness) -> None:
    """Script the model writing `</think>` byte by byte instead of as its one added token: the same
    text, which re-tokenizes differently."""
    tokenizer = h.service.tokenizer.tokenizer
    reasoning, rest = OUTPUT.split("</think>")
    spelled = [i for char in "</think>" for i in tokenizer.encode(char, add_special_tokens=False)]
    first = tokenizer.encode(reasoning) + spelled + tokenizer.encode(rest) + [h.engine.eos_token_id]
    assert tokenizer.decode(first, skip_special_tokens=False) == OUTPUT + EOS
    assert tokenizer.encode(OUTPUT) != first[:-1]
    answer = h.engine.script
    h.engine.script = lambda prompt: first if len(h.engine.requests) == 1 else answer(prompt)


@pytest.mark.parametrize("spelled", [False, True])
async def test_chat_replay_of_a_reordered_dsml_call_repeats_the_sampled_tokens(
    h: Harness, spelled: bool
) -> None:
    """Exact replay gives the sampled text; the live sequence's token ids (a text prefix of the new
    prompt) give the sampled tokens even where re-tokenizing that text would not."""
    if spelled:
        _spell_think_in_bytes(h)
    first = await h.openai.chat.completions.create(model="m", messages=QUESTION, tools=OPENAI_TOOLS)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Weather needs a lookup.",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"days":3,"city":"Paris & <Lyon>"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "if a < b && c > d"},
    ]
    second = await h.openai.chat.completions.create(model="m", messages=history, tools=OPENAI_TOOLS)
    assert second.choices[0].message.content == "Sunny."
    previous = _turn1(h)
    prompt = h.engine.requests[1][0]
    assert prompt[: len(previous)] == previous
    assert _text(h, prompt[len(previous) :]) == (
        f"{USER}<tool_result>if a < b && c > d</tool_result>{ASSISTANT}<think>"
    )


async def test_anthropic_tool_result_continues_with_the_reference_tail(h: Harness) -> None:
    first = await h.anthropic.messages.create(
        model="m", max_tokens=500, messages=QUESTION, tools=ANTHROPIC_TOOLS
    )
    (tool_use,) = [b for b in first.content if b.type == "tool_use"]
    assert tool_use.input == {"city": "Paris & <Lyon>", "days": 3}
    result = {"type": "tool_result", "tool_use_id": tool_use.id, "content": "18 C"}
    history = [
        *QUESTION,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    await h.anthropic.messages.create(model="m", max_tokens=500, messages=history, tools=ANTHROPIC_TOOLS)
    previous = _turn1(h)
    prompt = h.engine.requests[1][0]
    assert prompt[: len(previous)] == previous
    assert (
        _text(h, prompt[len(previous) - 1 :])
        == f"{EOS}{USER}<tool_result>18 C</tool_result>{ASSISTANT}<think>"
    )


def test_client_fixture_tools_render_through_the_dsml_template(tokenizer_dir: Path) -> None:
    """The Codex and Claude Code first requests' tools (namespace, hosted, defer_loading...) render."""
    from kvserve.chat.render import ChatRenderer

    info = load_hf_tokenizer(tokenizer_dir)
    renderer = ChatRenderer(info.chat_template, {"bos_token": BOS, "eos_token": EOS})
    codex = json.loads((FIXTURES / "codex-0.171.0_responses.json").read_text())
    claude = json.loads((FIXTURES / "claude-code-2.1.332_messages.json").read_text())
    for tools in (tools_from_responses(codex["tools"]), tools_from_anthropic(claude["tools"])):
        prompt = renderer.render(ChatRequest(messages=(Message("user", (TextPart("hi"),)),), tools=tools))
        assert all(json.dumps(t.name) in prompt for t in tools)
    names = [t.name for t in tools_from_responses(codex["tools"])]
    assert "multi_agent_v1__spawn_agent" in names and "web_search" not in names


# -- the real tiny model through `kvserve serve`'s composition ----------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    import httpx

    from kvserve.cli.serve import add_serve_args, build_app

    folder = save_tiny_deepseek_model(tmp_path_factory.mktemp("deepseek-tiny"))
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(
        ["--model", str(folder), "--dtype", "float32", "--device", "cpu", "--ctx", "4096"]
        + ["--data-dir", str(tmp_path_factory.mktemp("data"))]
    )
    app, engine = build_app(args)
    with serve_in_thread(app) as (url, _), httpx.Client(base_url=url, timeout=120) as client:
        yield client, app
    engine.shutdown()


@pytest.mark.parametrize("thinking", [True, False])
def test_real_tiny_deepseek_model_serves_tools(served, thinking: bool) -> None:
    client, app = served
    body = {
        "model": "m",
        "messages": QUESTION,
        "tools": OPENAI_TOOLS,
        "max_tokens": 6,
        "temperature": 0,
        "thinking": thinking,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 1000 and usage["completion_tokens"] <= 6  # the tools block rendered
    again = client.post("/v1/chat/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] // 16 * 16 - 16
    assert app.state.chat_service.settings.segmenter_factory.__self__.tool_parser == "deepseek_dsml"
