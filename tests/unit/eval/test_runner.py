"""The runner over real HTTP against the kvserve app on a scripted FakeEngine: grading, tool calls,
retries of incomplete cases with a doubled budget, the context clamp, the trace and its regrade."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.cli.embedded import serve_in_thread
from kvserve.eval.cases import CaseFilter, load_cases, select
from kvserve.eval.client import ChatSettings, EvalClient
from kvserve.eval.grade import CaseStatus
from kvserve.eval.report import render_report, summarize, summary_json
from kvserve.eval.result import CaseResult
from kvserve.eval.runner import EvalRunner, RunSettings
from kvserve.eval.trace import TraceWriter, read_trace, regrade
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.segmenter import OutputSyntax
from tests.api.fake_engine import ByteTokenizer, FakeEngine, FakeTokenizerInfo, reply

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}\n</tool_call>'
)
REPLIES = {
    "What is 47 + 38?": reply("47 + 38 = 85\nAnswer: 85"),
    "closest to the Sun": reply("Venus is hot.\nAnswer: A"),
    "weather in Lisbon": reply(CALL),
    "Reverse the string": reply("Let me think about this for a long while. " * 20, eos=False),
}
SMOKE = {c.id: c for c in select(load_cases(), CaseFilter(("smoke",)))}


def _script(prompt_ids: list[int]) -> list[int]:
    prompt = ByteTokenizer().decode(prompt_ids)
    return next((ids for key, ids in REPLIES.items() if key in prompt), reply("I do not know."))


@pytest.fixture
def server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(_script)
    syntax = OutputSyntax.detect(None, "hermes")
    service = ChatService(
        engine,
        FakeTokenizerInfo(),
        ChatServiceSettings(model_name="fake", max_model_len=2048, segmenter_factory=syntax.segmenter),
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake"))) as (url, _):
        yield url, engine


async def _run(url: str, case_ids: list[str], **settings: object) -> list[CaseResult]:
    runner = EvalRunner(EvalClient(url), [SMOKE[i] for i in case_ids], RunSettings(**settings))  # type: ignore[arg-type]
    try:
        return await runner.run()
    finally:
        await runner.client.aclose()


async def test_cases_are_graded_from_the_server_answers(server: tuple[str, FakeEngine]) -> None:
    url, _ = server
    ids = ["core/arith-01", "core/choice-01", "tools/weather", "HumanEval/23"]
    results = {r.case.id: r for r in await _run(url, ids, parallel=4, max_tokens=400)}
    assert results["core/arith-01"].status is CaseStatus.PASSED and results["core/arith-01"].extracted == "85"
    assert (
        results["core/choice-01"].status is CaseStatus.FAILED and results["core/choice-01"].extracted == "A"
    )
    weather = results["tools/weather"]
    assert weather.status is CaseStatus.PASSED, weather.detail
    assert weather.output is not None and weather.output.tool_calls[0].name == "get_weather"
    assert results["HumanEval/23"].status is CaseStatus.FAILED  # "I do not know." is no code
    assert all(r.usage.get("completion_tokens") for r in results.values())


async def test_an_incomplete_case_is_retried_with_twice_the_tokens(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    (result,) = await _run(url, ["core/strings-01"], retries=2, max_tokens=50)
    assert result.status is CaseStatus.INCOMPLETE and result.attempts == 3
    assert [params.max_tokens for _, params in engine.requests] == [50, 100, 200]


async def test_max_tokens_is_clamped_to_the_room_left_in_the_context(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    (result,) = await _run(url, ["core/arith-01"], max_tokens=10_000)
    ((prompt, params),) = engine.requests
    assert result.status is CaseStatus.PASSED
    assert result.max_tokens == params.max_tokens and len(prompt) + params.max_tokens <= 2048


async def test_an_unreachable_server_is_an_error_not_a_crash() -> None:
    runner = EvalRunner(EvalClient("http://127.0.0.1:9"), [SMOKE["core/arith-01"]], RunSettings())
    with pytest.raises(Exception, match="/v1/models"):
        await runner.run()
    await runner.client.aclose()


async def test_the_trace_regrades_to_the_same_grades(server: tuple[str, FakeEngine], tmp_path: Path) -> None:
    url, _ = server
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, {"suites": ["smoke"]})
    runner = EvalRunner(EvalClient(url), list(SMOKE.values()), RunSettings(retries=0), on_finish=writer.write)
    results = await runner.run()
    await runner.client.aclose()
    writer.close({"model": runner.model})
    header, traced = read_trace(path)
    assert header["suites"] == ["smoke"] and header["model"] == "fake" and len(traced) == len(results)
    record = json.loads(path.read_text().splitlines()[1])
    assert record["messages"][-1]["content"] and "output" in record and "extracted" in record
    outcome = regrade(traced)
    assert outcome.changes == []
    assert [r.status for r in outcome.results] == [r.status for r in traced]
    summary = summarize(outcome.results, ["smoke"])
    assert summary_json(summary, {})["suites"]["smoke"]["total"] == len(SMOKE)
    assert "suite smoke" in render_report(summary)


def test_regrade_skips_cases_that_did_not_finish(tmp_path: Path) -> None:
    """The seed's example: 1 PASSED and 2 STOPPED -> passed=1, not_graded=2, changed=0."""
    case = SMOKE["core/arith-01"]
    from kvserve.eval.grade import ModelOutput

    passed = CaseResult(case, CaseStatus.PASSED, "85", output=ModelOutput("Answer: 85"))
    stopped = [
        CaseResult(
            case.__class__(**{**case.__dict__, "id": f"s{i}"}),
            CaseStatus.STOPPED,
            output=ModelOutput("Answer: 3"),
        )
        for i in range(2)
    ]
    outcome = regrade([passed, *stopped])
    assert outcome.changes == [] and outcome.num_not_graded == 2
    assert [r.status for r in outcome.results] == [CaseStatus.PASSED, CaseStatus.STOPPED, CaseStatus.STOPPED]


def test_regrade_reports_a_changed_grade() -> None:
    case = SMOKE["core/arith-01"]
    from kvserve.eval.grade import ModelOutput

    stale = CaseResult(case, CaseStatus.FAILED, "256", output=ModelOutput("Answer: x = 40 + 45 = 85"))
    (change,) = regrade([stale]).changes
    assert (change.before, change.after, change.extracted_after) == (
        CaseStatus.FAILED,
        CaseStatus.PASSED,
        "85",
    )


@pytest.mark.parametrize("parallel", [1, 3])
async def test_parallel_is_the_number_of_requests_in_flight(parallel: int) -> None:
    in_flight: list[int] = []

    def script(prompt_ids: list[int]) -> list[int]:
        in_flight.append(len(engine.running) + 1)  # called just before this request joins `running`
        return reply("Answer: 85")

    engine = FakeEngine(script, token_delay_s=0.05)  # 0.5 s a reply: the first ones overlap
    service = ChatService(
        engine, FakeTokenizerInfo(), ChatServiceSettings(model_name="fake", max_model_len=2048)
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake"))) as (url, _):
        results = await _run(url, list(SMOKE)[:5], parallel=parallel, retries=0)
    assert len(in_flight) == 5 and all(r.status.is_done for r in results)
    assert max(in_flight) == parallel


async def test_temperature_and_seed_reach_the_sampler(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    await _run(url, ["core/arith-01"], chat=ChatSettings(temperature=0.7, seed=5), retries=0)
    ((_, params),) = engine.requests
    assert (params.temperature, params.seed) == (0.7, 5)
    await _run(url, ["core/arith-01"], retries=0)  # the default: greedy, no seed
    assert (engine.requests[-1][1].temperature, engine.requests[-1][1].seed) == (0.0, None)
