"""`--think on|off|auto` reaches the chat template, and what the model reasons is never graded: a
Qwen3-style template (an empty think block switches thinking off) on a scripted FakeEngine."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.cli.embedded import serve_in_thread
from kvserve.cli.eval import _run_settings
from kvserve.eval.cases import CaseFilter, load_cases, select
from kvserve.eval.client import ChatSettings, EvalClient
from kvserve.eval.grade import CaseStatus
from kvserve.eval.result import CaseResult
from kvserve.eval.runner import EvalRunner, RunSettings
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.segmenter import OutputSyntax
from tests.api.fake_engine import ByteTokenizer, FakeEngine, FakeTokenizerInfo, reply

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
THINK_OFF = "<think>\n\n</think>\n\n"
# Thinking on, the model reasons first, and a wrong "Answer:" inside the reasoning must not count.
THOUGHT = "<think>Maybe 84?\nAnswer: 84</think>\n47 + 38 = 85\nAnswer: 85"
# The eval flags _run_settings reads besides --think.
_ARGS = {
    "temperature": 0.0,
    "sample_seed": None,
    "parallel": 1,
    "retries": 0,
    "max_tokens": None,
    "code_timeout": 10.0,
}
CASE = select(load_cases(), CaseFilter(("core",), case_ids=("core/arith-01",)))[0]


def _script(prompt_ids: list[int]) -> list[int]:
    prompt = ByteTokenizer().decode(prompt_ids)
    return reply("Answer: 85" if prompt.endswith(THINK_OFF) else THOUGHT)


@pytest.fixture
def server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(_script)
    syntax = OutputSyntax.detect(TEMPLATE)
    assert syntax.reasoning is not None  # the template's </think> is what turns reasoning parsing on
    info = FakeTokenizerInfo(chat_template=TEMPLATE)
    service = ChatService(
        engine,
        info,
        ChatServiceSettings(model_name="fake", max_model_len=2048, segmenter_factory=syntax.segmenter),
    )
    with serve_in_thread(create_app(service, ApiSettings(served_model_name="fake"))) as (url, _):
        yield url, engine


async def _run_one(url: str, effort: str | None) -> CaseResult:
    settings = RunSettings(chat=ChatSettings(reasoning_effort=effort), retries=0)
    runner = EvalRunner(EvalClient(url), [CASE], settings)
    try:
        (result,) = await runner.run()
    finally:
        await runner.client.aclose()
    return result


@pytest.mark.parametrize("think", ["on", "off", "auto"])
async def test_think_flag_reaches_the_template(server: tuple[str, FakeEngine], think: str) -> None:
    url, engine = server
    effort = _run_settings(argparse.Namespace(**_ARGS, think=think)).chat.reasoning_effort
    result = await _run_one(url, effort)
    ((prompt_ids, _),) = engine.requests
    assert ByteTokenizer().decode(prompt_ids).endswith(THINK_OFF) is (think == "off")
    assert result.status is CaseStatus.PASSED and result.extracted == "85"
    assert result.output is not None
    if think == "off":
        assert result.output.reasoning == ""
    else:  # the reasoning came back apart from the answer, and its "Answer: 84" was not graded
        assert "Answer: 84" in result.output.reasoning and "84" not in result.output.content
