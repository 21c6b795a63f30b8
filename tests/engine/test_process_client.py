"""ProcessEngineClient: the engine in a child process behind the engine-client interface (issue 21).

One child serves the module (a spawn imports torch: seconds); the tiny model's greedy tokens through
the process equal the in-process engine's."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvserve.engine import ipc
from kvserve.engine.client import AsyncEngineClient, EngineDeadError
from kvserve.engine.client_protocol import EngineClient
from kvserve.engine.core import PromptTooLongError
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.process_client import EngineStartError, ProcessEngineClient
from kvserve.engine.request import FinishReason, Logprob
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar.constraint import ConstraintRecipe
from tests.engine.conftest import make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@dataclass(frozen=True, slots=True)
class _Running:
    pass


@dataclass(frozen=True, slots=True)
class _Echo:
    value: Any


@dataclass(frozen=True, slots=True)
class _Fail:
    pass


@dataclass(frozen=True, slots=True)
class _Crash:
    pass


@dataclass(frozen=True, slots=True)
class _Unanswered:
    pass


def _answer(core, query: object) -> object:
    match query:
        case _Running():
            return core.scheduler.num_running
        case _Echo(value=value):
            return value
        case _Fail():
            raise KeyError("nope")
        case _Crash():
            import os

            os._exit(3)
        case _:
            raise LookupError(query)


def _no_model() -> None:
    raise SystemExit("kvserve: no such model")


@pytest.fixture(scope="module")
def client(tiny_llama_dir: Path):
    client = ProcessEngineClient(functools.partial(make_engine, tiny_llama_dir), _answer, start_timeout=600)
    yield client
    client.shutdown()


async def _collect(client, request_id: str, prompt: list[int], params: SamplingParams = GREEDY):
    return [o async for o in client.generate(request_id, prompt, params)]


def test_outputs_cross_the_wire_unchanged() -> None:
    outputs = [
        EngineOutput("a", (5, 6), num_prompt_tokens=20, num_cached_tokens=16),
        EngineOutput("b", (), num_prompt_tokens=9, num_computed_tokens=4),
        EngineOutput(
            "c",
            (7,),
            (Logprob(7, -0.5, ((7, -0.5), (3, -2.0))),),
            FinishReason.ERROR,
            3,
            0,
            0,
            "rejected",
            256,
        ),
    ]
    wire = ipc.loads(ipc.dumps(ipc.encode_outputs(outputs)))
    assert isinstance(wire, list)
    assert [ipc.decode_output(item) for item in wire] == outputs
    assert len(wire[0]) == 4  # a plain decode output is a 4-tuple


async def test_streams_match_the_in_process_engine(client: ProcessEngineClient, tiny_llama_dir: Path) -> None:
    prompts = [[1 + i, 2, 3, 4 + i] * 5 for i in range(6)]
    remote = await asyncio.gather(*(_collect(client, f"p{i}", p) for i, p in enumerate(prompts)))
    local_client = AsyncEngineClient(make_engine(tiny_llama_dir))
    try:
        local = await asyncio.gather(*(_collect(local_client, f"l{i}", p) for i, p in enumerate(prompts)))
    finally:
        local_client.shutdown()
    for there, here in zip(remote, local, strict=True):
        assert [t for o in there for t in o.new_token_ids] == [t for o in here for t in o.new_token_ids]
        assert there[-1].finish_reason == FinishReason.LENGTH and there[-1].num_prompt_tokens == 20
        assert not any(o.finished for o in there[:-1])


def test_both_transports_are_engine_clients(client: ProcessEngineClient, tiny_llama_dir: Path) -> None:
    local_client = AsyncEngineClient(make_engine(tiny_llama_dir))
    try:
        assert isinstance(client, EngineClient) and isinstance(local_client, EngineClient)
    finally:
        local_client.shutdown()


async def test_engine_errors_reach_the_caller(client: ProcessEngineClient) -> None:
    with pytest.raises(PromptTooLongError):
        await _collect(client, "huge", [1] * 5000)
    with pytest.raises(ValueError, match="token ids"):
        await _collect(client, "bad", [10**6])
    with pytest.raises(ValueError, match="recipe"):
        await _collect_constrained(client, object())
    assert client.is_running
    assert len(await _collect(client, "after", [1, 2, 3])) >= 1


async def _collect_constrained(client: ProcessEngineClient, constraint: object) -> None:
    async for _ in client.generate("c", [1, 2], GREEDY, constraint=constraint):  # type: ignore[arg-type]
        pass


async def test_a_consumer_that_leaves_aborts_the_request(client: ProcessEngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    stream = client.generate("long", list(range(1, 200)), params)
    async for output in stream:
        if output.new_token_ids:
            break  # like a disconnected HTTP client
    await stream.aclose()
    for _ in range(200):
        if await asyncio.to_thread(client.query, _Running()) == 0:
            break
        await asyncio.sleep(0.02)
    assert client.query(_Running()) == 0


def test_queries_answer_and_fail_in_the_caller(client: ProcessEngineClient) -> None:
    assert client.query(_Echo((1, "two"))) == (1, "two")
    with pytest.raises(KeyError):
        client.query(_Fail())
    with pytest.raises(LookupError):
        client.query(_Unanswered())
    assert client.info.max_model_len == 2048 and client.info.disk_dir is None


def test_a_recipe_rebuilds_the_constraint() -> None:
    from kvserve.grammar.compiler import RecipeBuilder

    tokens = [bytes([i]) for i in range(256)]

    class ByteTokenizer:  # llguidance's TokenizerWrapper protocol
        eos_token_id = 0
        bos_token_id = None

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str) -> list[int]:
            return list(text.encode())

    builder = RecipeBuilder(ByteTokenizer(), 256, (0,))
    recipe = ConstraintRecipe('start: "ab"', None)
    wire = ipc.loads(ipc.dumps(ipc.AddRequest("r", [1], GREEDY, recipe, None)))
    assert isinstance(wire, ipc.AddRequest)
    constraint = builder.build(wire.recipe)
    assert constraint.recipe == recipe and constraint.is_masking
    assert constraint.accept_token(ord("a")) and not constraint.accept_token(ord("x"))


def test_a_model_that_cannot_load_fails_the_start() -> None:
    with pytest.raises(EngineStartError, match="no such model"):
        ProcessEngineClient(_no_model, start_timeout=600)


async def test_a_dead_engine_fails_streams_and_new_requests(tiny_llama_dir: Path) -> None:
    client = ProcessEngineClient(functools.partial(make_engine, tiny_llama_dir), _answer, start_timeout=600)
    try:
        with pytest.raises(EngineDeadError):
            client.query(_Crash(), timeout=30)
        for _ in range(100):
            if not client.is_running:
                break
            await asyncio.sleep(0.05)
        assert not client.is_running
        with pytest.raises(EngineDeadError):
            await _collect(client, "x", [1, 2, 3])
    finally:
        client.shutdown()


def test_warm_up_leaves_no_trace(tiny_llama_dir: Path) -> None:
    from kvserve.engine.warmup import warm_up

    core = make_engine(tiny_llama_dir)
    free = core.kv_manager.num_free_blocks
    warm_up(core)  # CPU: nothing to compile, nothing run
    assert core.kv_manager.stats.num_requests == 0
    warm_up(core, force=True)
    assert not core.has_unfinished_requests() and core.kv_manager.num_free_blocks == free
    assert core.kv_manager.pool.num_cached_blocks == 0 and core.kv_manager.stats.num_requests == 0


def test_steps_that_piled_up_leave_as_one_output_per_request() -> None:
    from kvserve.engine.engine_process import coalesce

    steps = [
        [EngineOutput("a", (1,)), EngineOutput("b", (), num_computed_tokens=8)],
        [EngineOutput("a", (2,)), EngineOutput("b", (5,), num_cached_tokens=4)],
        [EngineOutput("a", (3,), finish_reason=FinishReason.LENGTH)],
    ]
    merged = coalesce(steps)
    assert [(o.request_id, o.new_token_ids) for o in merged] == [("a", (1, 2, 3)), ("b", (5,))]
    assert merged[0].finished and merged[1].num_cached_tokens == 4
    assert coalesce(steps[:1]) is steps[0]


@dataclass(frozen=True, slots=True)
class _Question:
    """A front end's own question type: the engine relays any picklable object."""

    after: int


async def test_two_front_ends_share_the_engine(tiny_llama_dir: Path) -> None:
    """Each front end gets its own requests' outputs only; one that goes away has its requests
    aborted while the other goes on; tell and gather reach the other front end."""
    from kvserve.engine.process_client import EngineLink

    first = ProcessEngineClient(
        functools.partial(make_engine, tiny_llama_dir), _answer, start_timeout=600, num_front_ends=2
    )
    second = await asyncio.to_thread(EngineLink, first.peer_conns[0], 60)
    try:
        assert first.num_front_ends == second.num_front_ends == 2
        told: list[object] = []
        second.on_told = told.append
        second.on_ask = lambda question: (question, "second")
        first.tell({"call": "x"})
        question = _Question(1)
        assert await asyncio.to_thread(first.gather, question) == [(question, "second")]
        for _ in range(100):
            if told:
                break
            await asyncio.sleep(0.02)
        assert told == [{"call": "x"}]

        prompts = [[1 + i, 2, 3, 4 + i] * 5 for i in range(4)]
        here = await asyncio.gather(
            *(_collect(first if i % 2 else second, f"r{i}", p) for i, p in enumerate(prompts))
        )
        alone = [await _collect(first, f"alone{i}", p) for i, p in enumerate(prompts)]
        for mixed, single in zip(here, alone, strict=True):
            assert [t for o in mixed for t in o.new_token_ids] == [t for o in single for t in o.new_token_ids]
        assert {o.request_id for o in here[0]} == {"r0"}

        params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
        stream = second.generate("orphan", list(range(1, 50)), params)
        async for output in stream:
            if output.new_token_ids:
                break
        second.shutdown()  # the front end goes away mid-stream (no abort sent)
        for _ in range(200):
            if await asyncio.to_thread(first.query, _Running()) == 0:
                break
            await asyncio.sleep(0.02)
        assert first.query(_Running()) == 0
        assert first.is_running and len(await _collect(first, "still", [1, 2, 3])) >= 1
        assert await asyncio.to_thread(first.gather, "metrics") == []  # nobody else to ask
    finally:
        second.shutdown()
        first.shutdown()
    assert not first.is_running


async def test_the_server_sources_answer_through_the_engine_process(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """`engine_host.link_handle`'s typed queries, answered by `answer_query` in the child, and the
    disk tier's prompt sources coming back as events."""
    from kvserve.cli.engine_host import answer_query, link_handle
    from kvserve.config import KVStoreConfig
    from kvserve.serving.cache_view import CacheView
    from kvserve.serving.engine_stats import EngineStats
    from kvserve.serving.request_recorder import PromptSource, RequestRecorder

    store = KVStoreConfig(directory=str(tmp_path / "kv"), preload_fraction=0.0)
    build = functools.partial(make_engine, tiny_llama_dir, kv_store=store)
    handle = link_handle(ProcessEngineClient(build, answer_query, start_timeout=600))
    try:
        sources: dict[str, PromptSource] = {}

        class Recorder(RequestRecorder):
            def note_source(self, request_id: str, source: PromptSource) -> None:
                sources[request_id] = source

        handle.feed_prompt_sources(Recorder())
        await _collect(handle.client, "sourced", [1 + i % 50 for i in range(40)])
        assert sources == {"sourced": PromptSource(0, 0, None)}
        assert handle.disk_dir is not None and handle.text_prefix is not None
        assert handle.set_turn_markers(((1, 2), (3,))) is None
        assert handle.text_prefix("no checkpoint starts like this") is None
        assert handle.checkpoint_tokens("no-such-checkpoint") is None
        stats = handle.engine_stats()
        assert isinstance(stats, EngineStats) and stats.num_running == 0 and stats.disk is not None
        assert isinstance(handle.cache_view(), CacheView)
    finally:
        handle.shutdown()
