"""ChatService with the FakeEngine: events, stop strings, usage, context check, abort."""

from __future__ import annotations

import asyncio

import pytest

from kvserve.chat.conversation import ChatRequest, GenerationOptions, Message, TextPart, TextRequest
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.errors import ContextLengthExceededError, RequestError
from kvserve.serving.events import Failed, Finished, PrefillProgress, TextDelta, Usage
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply


def _service(engine: FakeEngine, ctx: int = 4096, keepalive_s: float = 5.0) -> ChatService:
    return ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=ctx, keepalive_s=keepalive_s),
    )


def _chat(text: str = "Hi", **options: object) -> ChatRequest:
    return ChatRequest(messages=(Message("user", (TextPart(text),)),), options=GenerationOptions(**options))


async def _events(service: ChatService, request: ChatRequest) -> list[object]:
    return [e async for e in service.generate(service.prepare_chat(request))]


async def test_text_stream_ends_with_usage_and_finish() -> None:
    service = _service(FakeEngine(reply("héllo wörld")))
    events = await _events(service, _chat())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "héllo wörld"
    n_prompt = len(service.prepare_chat(_chat()).prompt_token_ids)
    assert events[0] == Usage(n_prompt, 0, 0)
    assert events[-2:] == [Usage(n_prompt, len(reply("héllo wörld")), 0), Finished("stop")]


async def test_stop_string_cuts_text_and_aborts_the_engine() -> None:
    engine = FakeEngine(reply("one two STOP three"))
    events = await _events(_service(engine), _chat(stop=("STOP",)))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "one two "
    assert events[-1] == Finished("stop", "STOP")
    assert len(engine.aborted) == 1 and not engine.running


async def test_max_tokens_gives_length_and_zero_skips_the_engine() -> None:
    engine = FakeEngine(reply("abcdef"))
    events = await _events(_service(engine), _chat(max_tokens=3))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "abc"
    assert events[-1] == Finished("length")
    events = await _events(_service(engine), _chat(max_tokens=0))
    assert events[-1] == Finished("length") and len(engine.requests) == 1


def test_context_overflow_is_raised_before_queueing() -> None:
    engine = FakeEngine(reply("x"))
    service = _service(engine, ctx=64)
    n = len(service.prepare_chat(_chat("a")).prompt_token_ids)
    service = _service(engine, ctx=n + 1)
    service.prepare_chat(_chat("a"))  # ctx - 1 tokens is accepted
    service = _service(engine, ctx=n)
    with pytest.raises(ContextLengthExceededError) as info:
        service.prepare_chat(_chat("a"))
    assert (info.value.n_prompt_tokens, info.value.n_ctx, info.value.param) == (n, n, "messages")
    assert not engine.requests


def test_bad_sampling_values_are_request_errors() -> None:
    from kvserve.chat.conversation import SamplingOptions

    service = _service(FakeEngine())
    with pytest.raises(RequestError, match="top_p"):
        service.prepare_chat(_chat(sampling=SamplingOptions(top_p=5.0)))


async def test_engine_failure_mid_stream_is_a_failed_event() -> None:
    events = await _events(_service(FakeEngine(reply("abcdef"), fail_after=2)), _chat())
    assert isinstance(events[-1], Failed)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "ab"


async def test_heartbeats_during_a_slow_prefill() -> None:
    service = _service(FakeEngine(reply("ok"), prefill_delay_s=0.25), keepalive_s=0.05)
    events = await _events(service, _chat())
    assert sum(isinstance(e, PrefillProgress) for e in events) >= 2
    assert events[-1] == Finished("stop")


async def test_closing_the_stream_aborts_the_request() -> None:
    engine = FakeEngine(reply("x" * 100), token_delay_s=0.01)
    service = _service(engine)
    stream = service.generate(service.prepare_chat(_chat()))
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    await stream.aclose()
    assert not engine.running and len(engine.aborted) == 1


async def test_cancelling_the_consumer_aborts_the_request() -> None:
    engine = FakeEngine(reply("x" * 100), token_delay_s=0.01)
    service = _service(engine)

    async def consume() -> None:
        async for _ in service.generate(service.prepare_chat(_chat())):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not engine.running and len(engine.aborted) == 1


async def test_raw_prompt_and_cached_tokens_on_a_second_turn() -> None:
    engine = FakeEngine(reply("answer"))
    service = _service(engine)
    first = [e async for e in service.generate(service.prepare_text(TextRequest("x" * 40)))]
    second = [e async for e in service.generate(service.prepare_text(TextRequest("x" * 40 + "answer more")))]
    assert first[-2].cached_tokens == 0
    assert second[-2].cached_tokens == 32


async def test_segmenter_factory_is_the_parsing_seam() -> None:
    """Issue 4 plugs reasoning/tool parsers in here; a fake one shows events and finish reasons flow."""
    from kvserve.serving.events import ReasoningDelta, ToolCallEnd, ToolCallStart

    class FakeToolParser:
        def feed(self, text: str) -> list:
            return [ReasoningDelta(text)]

        def finish(self) -> list:
            return [ToolCallStart(0, "ab", "f"), ToolCallEnd(0, "{}")]

        @property
        def sampled_blocks(self) -> list:
            return []

    engine = FakeEngine(reply("thinking"))
    service = ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(
            model_name="fake", max_model_len=4096, segmenter_factory=lambda chat, prompt: FakeToolParser()
        ),
    )
    events = await _events(service, _chat())
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "thinking"
    assert events[-1] == Finished("tool_calls")
    raw = [e async for e in service.generate(service.prepare_text(TextRequest("p")))]
    assert raw[-1] == Finished("stop") and any(isinstance(e, TextDelta) for e in raw)


async def test_max_tokens_limit_caps_requests_with_and_without_a_limit() -> None:
    engine = FakeEngine(reply("abcdef"))
    service = ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=4096, max_tokens_limit=4),
    )
    for asked in (None, 100):
        events = await _events(service, _chat(max_tokens=asked))
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "abcd"
        assert events[-1] == Finished("length")
    events = await _events(service, _chat(max_tokens=2))  # a smaller request limit still wins
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "ab"
    assert [params.max_tokens for _, params in engine.requests] == [4, 4, 2]


async def test_sampling_defaults_fill_only_what_a_request_leaves_out() -> None:
    from kvserve.chat.conversation import SamplingOptions
    from kvserve.models.generation_config import resolve_sampling_defaults

    engine = FakeEngine(reply("ok"))
    defaults = resolve_sampling_defaults(
        "auto",
        preset={
            "temperature": 0.2,
            "repetition_penalty": 1.1,
            "repetition_last_n": 64,
            "dry_multiplier": 0.8,
        },
    )
    service = ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=4096, sampling_defaults=defaults),
    )
    await _events(service, _chat())
    first = engine.requests[-1][1]
    assert (first.temperature, first.top_k, first.top_p, first.min_p) == (0.2, 40, 0.95, 0.05)
    assert (first.repetition_penalty, first.repetition_last_n) == (1.1, 64)
    assert (first.dry_multiplier, first.dry_base, first.dry_allowed_length) == (0.8, 1.75, 2)
    sent = SamplingOptions(temperature=0.7, top_k=5, top_p=0.5, min_p=0.0, repetition_penalty=1.3)
    await _events(service, _chat(sampling=sent))
    mine = engine.requests[-1][1]
    assert (mine.temperature, mine.top_k, mine.top_p, mine.min_p) == (0.7, 5, 0.5, 0.0)
    # A request's own penalty has vLLM's meaning (the whole sequence), not the default's window.
    assert (mine.repetition_penalty, mine.repetition_last_n) == (1.3, 0)
    assert mine.dry_multiplier == 0.8  # no API has a field for DRY: always the server's
    # A request that asks for greedy gets the plain argmax: no default penalty of any kind.
    await _events(service, _chat(sampling=SamplingOptions(temperature=0.0)))
    greedy = engine.requests[-1][1]
    assert greedy.is_greedy and not greedy.has_penalties
    await _events(service, _chat(sampling=SamplingOptions(temperature=0.0, repetition_penalty=1.2)))
    assert engine.requests[-1][1].repetition_penalty == 1.2  # unless it sends one itself
    await _events(_service(engine), _chat())  # no defaults: the APIs' own
    neutral = engine.requests[-1][1]
    assert (neutral.temperature, neutral.top_k, neutral.top_p, neutral.min_p) == (1.0, 0, 1.0, 0.0)
    assert neutral.repetition_penalty == 1.0
