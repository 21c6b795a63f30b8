"""Exact tool replay and live tool continuation through the HTTP APIs (FakeEngine, official SDKs).

Turn 1 samples a Hermes call; turn 2 sends the result back. With exact replay the second prompt
starts with every token of the first prompt and of the sampled output, so the engine's prefix
cache covers the whole first turn. The Responses and Anthropic turns also reason first: the ChatML
template drops past reasoning, so only a live continuation keeps those tokens.
"""

from __future__ import annotations

import pickle

import pytest

from kvserve.reasoning import SYNTAXES as REASONING
from kvserve.serving.live_sequences import LiveSequences
from kvserve.serving.segmenter import OutputSyntax
from kvserve.serving.shared_state import LiveSequenceSaved, SharedState, ToolCallsSampled
from kvserve.serving.tool_memory import ToolReplayMemory
from tests.api.conftest import Harness, make_harness
from tests.api.fake_engine import BLOCK_SIZE, ByteTokenizer, FakeEngine, reply

CALL = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
)
THOUGHT = "<think>The tool knows.</think>"
ANSWER = "It is 18 C."
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}]
QUESTION_ANTHROPIC = [{"role": "user", "content": "Weather in Paris?"}]
TAIL = "\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _harness(exact_replay: bool = True, think: bool = False) -> Harness:
    first = THOUGHT + CALL if think else CALL

    def script(prompt: list[int]) -> list[int]:
        return reply(ANSWER if "<tool_response>" in ByteTokenizer().decode(prompt) else first)

    options = {"live_sequences": LiveSequences()}
    if exact_replay:
        options["tool_memory"] = ToolReplayMemory()
    syntax = OutputSyntax("hermes", REASONING["think"] if think else None)
    return make_harness(FakeEngine(script), segmenter_factory=syntax.segmenter, service_options=options)


@pytest.fixture
async def h():
    harness = _harness(think=True)
    yield harness
    await harness.http.aclose()


def _turn1_tokens(h: Harness) -> list[int]:
    """The first request's prompt and everything it sampled (EOS included)."""
    return h.engine.requests[0][0] + h.engine.script(h.engine.requests[0][0])


def _text(tokens: list[int]) -> str:
    return ByteTokenizer().decode(tokens, skip_special_tokens=False)


# -- exact replay (OpenAI Chat: no live continuation, replay memory only) ------------------------


async def _chat_turns(h: Harness, arguments: str):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = await h.openai.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages += [
        {
            "role": "assistant",
            "content": first.choices[0].message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    return await h.openai.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)


async def test_chat_replay_with_reordered_arguments_hits_the_whole_first_turn() -> None:
    h = _harness()
    second = await _chat_turns(h, '{"unit":"C","city":"Paris"}')
    assert second.choices[0].message.content == ANSWER
    previous = _turn1_tokens(h)
    assert h.engine.requests[1][0][: len(previous)] == previous
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == len(previous) // BLOCK_SIZE * BLOCK_SIZE


async def test_disabled_exact_replay_renders_canonically_and_misses() -> None:
    h = _harness(exact_replay=False)
    second = await _chat_turns(h, '{"unit":"C","city":"Paris"}')
    previous = _turn1_tokens(h)
    assert h.engine.requests[1][0][: len(previous)] != previous
    assert '{"unit": "C", "city": "Paris"}' in _text(h.engine.requests[1][0])
    assert second.usage.prompt_tokens_details.cached_tokens < len(previous) // BLOCK_SIZE * BLOCK_SIZE


# -- Responses -------------------------------------------------------------------------------


async def _responses_call(h: Harness, stream: bool = False) -> tuple[str, str]:
    """(response id, call id) of a first turn that called the tool."""
    if not stream:
        first = await h.openai.responses.create(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS)
        (call,) = [o for o in first.output if o.type == "function_call"]
        return first.id, call.call_id
    async with h.openai.responses.stream(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS) as s:
        final = await s.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    return final.id, call.call_id


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_output_only_continues_the_exact_sequence(h: Harness, stream: bool) -> None:
    _, call_id = await _responses_call(h, stream)
    output = {"type": "function_call_output", "call_id": call_id, "output": "18 C"}
    second = await h.openai.responses.create(model="m", input=[output], tools=RESPONSES_TOOLS)
    assert second.output_text == ANSWER
    previous = _turn1_tokens(h)
    prompt = h.engine.requests[1][0]
    assert prompt[: len(previous)] == previous and _text(prompt[len(previous) :]) == TAIL
    assert second.usage.input_tokens_details.cached_tokens == len(previous) // BLOCK_SIZE * BLOCK_SIZE


async def test_responses_previous_response_id_continues_live(h: Harness) -> None:
    response_id, call_id = await _responses_call(h)
    output = {"type": "function_call_output", "call_id": call_id, "output": "18 C"}
    await h.openai.responses.create(
        model="m", input=[output], tools=RESPONSES_TOOLS, previous_response_id=response_id
    )
    previous = _turn1_tokens(h)
    assert h.engine.requests[1][0] == previous + ByteTokenizer().encode(TAIL)


async def test_responses_unknown_call_id_is_the_reference_400(h: Harness) -> None:
    output = {"type": "function_call_output", "call_id": "call_nope", "output": "x"}
    response = await h.http.post("/v1/responses", json={"model": "m", "input": [output]})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "Responses continuation state is not available for call_id call_nope; "
        "retry by replaying the full input history"
    )


async def test_responses_gone_state_is_409_and_full_replay_still_works(h: Harness) -> None:
    _, call_id = await _responses_call(h)
    h.service.live_sequences = LiveSequences()  # evicted (or a restart): the memory still knows the id
    output = {"type": "function_call_output", "call_id": call_id, "output": "18 C"}
    response = await h.http.post("/v1/responses", json={"model": "m", "input": [output]})
    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        "Responses continuation state is not available; retry by replaying the full input history"
    )
    call = {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": '{"unit":"C","city":"Paris"}',
    }
    user = {"type": "message", "role": "user", "content": "Weather in Paris?"}
    replay = await h.openai.responses.create(model="m", input=[user, call, output], tools=RESPONSES_TOOLS)
    assert replay.output_text == ANSWER
    assert CALL.split("Let me check.")[1] in _text(h.engine.requests[1][0])  # the sampled bytes


async def test_another_front_end_continues_what_this_one_shared(h: Harness) -> None:
    """`serve --api-servers`: the second turn lands on another front end, which learned the first
    turn's live sequence and call markup from this one's shared messages (pickled, as on the pipe)."""
    other = _harness(think=True)
    shared: list[SharedState] = []

    def share(message: SharedState) -> None:
        shared.append(message)
        other.service.apply_shared(pickle.loads(pickle.dumps(message)))

    h.service.share = share
    _, call_id = await _responses_call(h)
    assert [type(m) for m in shared] == [ToolCallsSampled, LiveSequenceSaved]
    assert other.service.tool_memory is not None and other.service.tool_memory.knows(call_id)
    output = {"type": "function_call_output", "call_id": call_id, "output": "18 C"}
    second = await other.openai.responses.create(model="m", input=[output], tools=RESPONSES_TOOLS)
    assert second.output_text == ANSWER
    assert other.engine.requests[0][0] == _turn1_tokens(h) + ByteTokenizer().encode(TAIL)
    await other.http.aclose()


# -- Anthropic -------------------------------------------------------------------------------


async def _anthropic_turn1(h: Harness) -> tuple[list[dict], str]:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = await h.anthropic.messages.create(
        model="m", max_tokens=200, messages=messages, tools=ANTHROPIC_TOOLS
    )
    assert first.stop_reason == "tool_use"
    (tool_use,) = [b for b in first.content if b.type == "tool_use"]
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": tool_use.id,
                "name": "get_weather",
                "input": {"unit": "C", "city": "Paris"},
            },
        ],
    }
    return [*messages, assistant], tool_use.id


def _result(tool_use_id: str) -> dict:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "18 C"}],
    }


async def test_anthropic_tool_results_continue_the_live_sequence(h: Harness) -> None:
    history, tool_use_id = await _anthropic_turn1(h)
    second = await h.anthropic.messages.create(
        model="m", max_tokens=200, messages=[*history, _result(tool_use_id)], tools=ANTHROPIC_TOOLS
    )
    assert second.content[0].text == ANSWER
    previous = _turn1_tokens(h)
    assert h.engine.requests[1][0] == previous + ByteTokenizer().encode(TAIL)
    assert "The tool knows." in _text(h.engine.requests[1][0])  # hidden reasoning kept
    assert second.usage.cache_read_input_tokens == len(previous) // BLOCK_SIZE * BLOCK_SIZE


async def test_anthropic_edited_history_is_rendered_not_continued(h: Harness) -> None:
    history, tool_use_id = await _anthropic_turn1(h)
    history[0] = {"role": "user", "content": "Weather in Paris, please?"}
    await h.anthropic.messages.create(
        model="m", max_tokens=200, messages=[*history, _result(tool_use_id)], tools=ANTHROPIC_TOOLS
    )
    prompt = _text(h.engine.requests[1][0])
    assert "Weather in Paris, please?" in prompt and prompt.endswith(TAIL)
    assert "The tool knows." not in prompt  # rendered: ChatML drops past reasoning


async def test_anthropic_unknown_and_gone_tool_use_ids(h: Harness) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": [_result("toolu_x")]}
    response = await h.http.post("/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Anthropic continuation state is not available for tool_use_id toolu_x; "
            "retry by replaying the full messages history",
        },
    }
    _, tool_use_id = await _anthropic_turn1(h)
    h.service.live_sequences = LiveSequences()
    response = await h.http.post("/v1/messages", json={**body, "messages": [_result(tool_use_id)]})
    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        "Anthropic continuation state is not available; retry by replaying the full messages history"
    )


async def test_chat_completions_keep_unbound_tool_results() -> None:
    """Chat Completions has no live binding (ref §5.7): a lone tool message is just rendered."""
    h = _harness()
    body = {"model": "m", "messages": [{"role": "tool", "tool_call_id": "x", "content": "18 C"}]}
    response = await h.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


async def test_anthropic_full_replay_allows_an_unknown_id(h: Harness) -> None:
    """Calls made elsewhere (another server, a client-side edit): the history carries them, so render."""
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_elsewhere", "name": "get_weather", "input": {"city": "Oslo"}}
        ],
    }
    body = {
        "model": "m",
        "max_tokens": 50,
        "messages": [*QUESTION_ANTHROPIC, assistant, _result("toolu_elsewhere")],
        "tools": ANTHROPIC_TOOLS,
    }
    response = await h.http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    prompt = _text(h.engine.requests[0][0])
    assert '"arguments": {"city": "Oslo"}' in prompt and prompt.endswith(TAIL)
