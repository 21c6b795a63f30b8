"""AsyncEngineClient: streaming across the thread boundary, cancellation frees blocks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvserve.engine.client import AsyncEngineClient
from kvserve.engine.core import PromptTooLongError
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import make_engine


@pytest.fixture()
def client(tiny_llama_dir: Path):
    client = AsyncEngineClient(make_engine(tiny_llama_dir))
    yield client
    client.shutdown()


async def _collect(client: AsyncEngineClient, request_id: str, prompt: list[int], params: SamplingParams):
    return [o async for o in client.generate(request_id, prompt, params)]


async def test_concurrent_streams_complete(client: AsyncEngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [[1 + i, 2, 3, 4 + i] * 5 for i in range(6)]
    results = await asyncio.gather(*(_collect(client, f"c{i}", p, params) for i, p in enumerate(prompts)))
    for outputs in results:
        assert sum(len(o.new_token_ids) for o in outputs) == 12
        assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
        assert outputs[-1].num_prompt_tokens == 20


async def test_consumer_cancel_aborts_and_frees_blocks(client: AsyncEngineClient) -> None:
    manager = client.core.kv_manager
    free_at_start = manager.num_free_blocks
    params = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    stream = client.generate("long", list(range(1, 200)), params)
    async for output in stream:
        if output.new_token_ids:
            break  # the consumer leaves mid-generation, like a disconnected HTTP client
    await stream.aclose()
    deadline = time.monotonic() + 2.0
    while manager.num_free_blocks != free_at_start and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert manager.num_free_blocks == free_at_start
    assert client.core.scheduler.num_running == 0


async def test_too_long_prompt_raises_before_queueing(client: AsyncEngineClient) -> None:
    params = SamplingParams(max_tokens=4)
    with pytest.raises(PromptTooLongError):
        await _collect(client, "huge", [1] * 5000, params)
    assert client.is_running


async def test_queued_outputs_reach_a_late_consumer_as_one() -> None:
    """A consumer that slept through steps gets their tokens in one output, stopping at the finish."""
    import asyncio

    from kvserve.engine.client import merge_queued
    from kvserve.engine.outputs import EngineOutput
    from kvserve.engine.request import FinishReason

    queue: asyncio.Queue = asyncio.Queue()
    for output in (
        EngineOutput("r", (), num_computed_tokens=16),
        EngineOutput("r", (7,), num_cached_tokens=16),
        EngineOutput("r", (8,), finish_reason=FinishReason.LENGTH, num_cache_write_tokens=3),
    ):
        queue.put_nowait(output)
    merged = merge_queued(await queue.get(), queue)
    assert merged.new_token_ids == (7, 8) and merged.finish_reason == FinishReason.LENGTH
    assert merged.num_cached_tokens == 0 and merged.num_cache_write_tokens == 3  # the last one's counters
    assert queue.empty()
    queue.put_nowait(ValueError("bad"))
    with pytest.raises(ValueError):
        merge_queued(await queue.get(), queue)


async def test_a_built_engine_is_built_on_the_thread_that_runs_it(tiny_llama_dir: Path) -> None:
    """`AsyncEngineClient(build=...)` (what `kvserve serve` uses): the model loads on the engine
    thread, so that thread is the only one with an OpenMP team (kvserve/openmp.py)."""
    import threading

    built_on: list[str] = []

    def build():
        built_on.append(threading.current_thread().name)
        return make_engine(tiny_llama_dir)

    client = AsyncEngineClient(build=build)
    try:
        assert built_on == ["kvserve-engine"]
        outputs = await _collect(client, "b", [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=3))
        assert sum(len(o.new_token_ids) for o in outputs) == 3
    finally:
        client.shutdown()


def test_a_failed_build_raises_on_the_callers_thread() -> None:
    def build():
        raise SystemExit("kvserve: no such model")  # build_engine's one-line errors

    with pytest.raises(SystemExit, match="no such model"):
        AsyncEngineClient(build=build)
