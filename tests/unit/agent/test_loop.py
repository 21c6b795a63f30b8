"""The agent loop against a scripted model over real HTTP (the kvserve app on a FakeEngine)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kvserve.agent.client import ModelClient
from kvserve.agent.compaction import TokenEstimator
from kvserve.agent.confirm import ConfirmPolicy
from kvserve.agent.events import TextDelta
from kvserve.agent.loop import Agent, LoopConfig, TurnStatus
from kvserve.agent.messages import Message
from kvserve.agent.prompts import INTERRUPTED, NOT_RUN
from kvserve.agent.session import Session
from kvserve.agent.toolbox import Toolbox
from kvserve.agent.tools.base import ToolContext
from kvserve.agent.workspace import Workspace
from kvserve.engine.request import CheckpointHint
from tests.unit.agent.scripted_server import SUMMARY, scripted_server, tool_call


class Recorder:
    def __init__(self) -> None:
        self.events: list = []
        self.notices: list[str] = []
        self.tools: list[str] = []
        self.on_text = None

    def on_generation_start(self, kind: str) -> None:
        self.events.append(("start", kind))

    def on_stream_event(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TextDelta) and self.on_text:
            self.on_text(event)

    def on_generation_end(self, usage) -> None:
        self.events.append(("end", usage))

    def on_tool_start(self, call) -> None:
        self.tools.append(call.name)

    def on_tool_end(self, call, outcome) -> None:
        pass

    def on_notice(self, text: str) -> None:
        self.notices.append(text)


def make_agent(url: str, root: Path, ctx: int = 8192, max_tokens: int = 512, **kw) -> tuple[Agent, Recorder]:
    client = ModelClient(url)
    toolbox = Toolbox(ToolContext(Workspace.create(root)), ConfirmPolicy(is_yes_to_all=True), lambda q: False)
    session = Session("t", [Message("system", "You are a test agent.")])
    recorder = Recorder()
    agent = Agent(client, toolbox, session, LoopConfig(ctx, max_tokens, **kw), recorder)
    return agent, recorder


def roles(agent: Agent) -> list[str]:
    return [m.role for m in agent.session.messages]


def test_the_model_calls_tools_and_answers(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    replies = [
        "Let me look." + tool_call("read", path="notes.txt"),
        tool_call("edit", path="notes.txt", old="beta", new="gamma"),
        "Done: beta is now gamma.",
    ]
    with scripted_server(replies) as server:
        agent, recorder = make_agent(server.url, tmp_path)
        result = agent.run_turn("replace beta with gamma in notes.txt")
    assert result.status is TurnStatus.DONE and result.text == "Done: beta is now gamma."
    assert (tmp_path / "notes.txt").read_text() == "alpha\ngamma\n"
    assert recorder.tools == ["read", "edit"]
    assert roles(agent) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    read_result = agent.session.messages[3]
    assert "     2\tbeta" in read_result.content
    # the tool result went back to the model (Hermes <tool_response> in the rendered prompt)
    assert "<tool_response>" in server.script.prompts[1] and "beta" in server.script.prompts[1]
    # usage arrives and later prompts reuse the earlier ones from the prefix cache
    assert agent.session.usage.prompt_tokens > 0 and agent.session.usage.cached_tokens > 0


def test_tool_errors_go_back_to_the_model(tmp_path: Path) -> None:
    replies = [tool_call("read", path="missing.txt"), "It does not exist."]
    with scripted_server(replies) as server:
        agent, _ = make_agent(server.url, tmp_path)
        result = agent.run_turn("read missing.txt")
    assert result.text == "It does not exist."
    assert "no such file" in agent.session.messages[3].content
    assert "no such file" in server.script.prompts[1]


def test_a_second_turn_keeps_the_history(tmp_path: Path) -> None:
    with scripted_server(["first", "second"]) as server:
        agent, _ = make_agent(server.url, tmp_path)
        agent.run_turn("one")
        agent.run_turn("two")
    assert roles(agent) == ["system", "user", "assistant", "user", "assistant"]
    assert "one" in server.script.prompts[1] and "first" in server.script.prompts[1]


def test_interrupt_during_generation_keeps_a_consistent_session(tmp_path: Path) -> None:
    with scripted_server(["word " * 400, "after"], token_delay_s=0.005) as server:
        agent, recorder = make_agent(server.url, tmp_path)
        recorder.on_text = lambda event: agent.cancel.set() if len(recorder.events) > 30 else None
        started = time.monotonic()
        result = agent.run_turn("talk a lot")
        assert time.monotonic() - started < 3
        assert result.status is TurnStatus.CANCELLED
        last = agent.session.messages[-1]
        assert (
            last.role == "assistant"
            and last.content.endswith(INTERRUPTED)
            and last.content.startswith("word")
        )
        _wait(lambda: server.engine.aborted)  # the server aborted the request when the client hung up
        recorder.on_text = None
        assert agent.run_turn("go on").text == "after"


def test_interrupt_during_a_tool_gives_every_call_a_result(tmp_path: Path) -> None:
    replies = [tool_call("bash", command="sleep 30", wait_sec=60) + tool_call("list", path="."), "ok"]
    with scripted_server(replies) as server:
        agent, _ = make_agent(server.url, tmp_path)
        threading.Timer(1.0, agent.cancel.set).start()
        started = time.monotonic()
        result = agent.run_turn("sleep")
        assert result.status is TurnStatus.CANCELLED and time.monotonic() - started < 6
        assert roles(agent) == ["system", "user", "assistant", "tool", "tool"]
        bash_result, list_result = agent.session.messages[3:]
        assert "interrupted by the user" in bash_result.content and list_result.content == NOT_RUN
        assert agent.run_turn("next").text == "ok"  # the server accepts the transcript


def test_compaction_on_a_small_context(tmp_path: Path) -> None:
    # The byte-level fake tokenizer: ~4.7K tokens of tool schemas, each read adds ~1K.
    (tmp_path / "big.txt").write_text("".join(f"filler line number {i:04}\n" for i in range(40)))
    replies = [r for i in range(8) for r in (tool_call("read", path="big.txt"), f"read {i}")]
    with scripted_server(replies, ctx=10_000) as server:
        agent, recorder = make_agent(server.url, tmp_path, ctx=10_000, max_tokens=256, is_kvserve=True)
        for i in range(8):
            assert agent.run_turn(f"turn {i}: read big.txt").text == f"read {i}"
            if agent.session.num_compactions:
                break
        assert server.script.num_summaries == 1 and agent.session.num_compactions == 1
        messages = agent.session.messages
        assert messages[0].role == "system" and messages[1].is_internal and SUMMARY in messages[1].content
        assert (
            messages[2].role == "user" and messages[2].content == f"turn {i}: read big.txt"
        )  # a user boundary
        assert roles(agent)[3:] == ["assistant", "tool", "assistant"]
        # the summary request carried the older history; the next prompt starts from the summary
        summary_prompt = next(p for p in server.script.prompts if "context compaction request" in p)
        assert "turn 0: read big.txt" in summary_prompt
        assert agent.run_turn("next").text == f"read {i + 1}"
        assert "turn 0" not in server.script.prompts[-1] and SUMMARY in server.script.prompts[-1]
        # kvserve's cache hints: a session checkpoint for every answer, none for a summary
        for prompt, hint in zip(server.script.prompts, server.engine.checkpoint_hints, strict=True):
            is_summary = "context compaction request" in prompt.rsplit("<|im_start|>user", 1)[-1]
            assert hint == CheckpointHint("t", save_system=True, save_session=not is_summary)
    assert any("compacting" in n for n in recorder.notices)


def test_a_tool_call_cut_by_the_token_limit_is_not_executed(tmp_path: Path) -> None:
    replies = [tool_call("write", path="x.txt", content="y" * 600), "I will write it in parts."]
    with scripted_server(replies) as server:
        agent, recorder = make_agent(server.url, tmp_path, max_tokens=100)
        result = agent.run_turn("write x.txt")
    assert result.text == "I will write it in parts."
    assert not (tmp_path / "x.txt").exists()
    assert not any(m.tool_calls for m in agent.session.messages)
    assert "was NOT executed" in server.script.prompts[-1]
    assert any("not executed" in n for n in recorder.notices)


def test_a_prompt_too_long_for_the_server_is_compacted_and_retried(tmp_path: Path) -> None:
    (tmp_path / "huge.txt").write_text("z" * 60 + "\n" + "".join(f"row {i:05}\n" for i in range(600)))
    replies = ["first answer", tool_call("read", path="huge.txt", max_lines=600), "done reading"]
    with scripted_server(replies, ctx=9000) as server:
        agent, recorder = make_agent(server.url, tmp_path, ctx=9000, max_tokens=128)
        agent.estimator = UnderEstimator()  # so only the server's 400 can tell the prompt is too long
        agent.run_turn("hello")
        result = agent.run_turn("read huge.txt")
    assert result.text == "done reading", result
    assert agent.session.num_compactions == 1
    assert any("no longer fits" in n for n in recorder.notices)


def test_model_errors_end_the_turn_cleanly(tmp_path: Path) -> None:
    with scripted_server(["x"]) as server:
        agent, _ = make_agent(server.url, tmp_path, temperature=-5.0)
        result = agent.run_turn("hi")
    assert result.status is TurnStatus.ERROR and "HTTP 400" in result.error
    assert roles(agent) == ["system", "user"]


def test_an_engine_failure_mid_stream_ends_the_turn_cleanly(tmp_path: Path) -> None:
    with scripted_server(["a long answer that breaks"], fail_after=5) as server:
        agent, recorder = make_agent(server.url, tmp_path)
        result = agent.run_turn("hi")
    assert result.status is TurnStatus.ERROR and "engine" in result.error.lower()
    assert roles(agent) == ["system", "user"]
    assert any("model error" in n for n in recorder.notices)


@pytest.mark.parametrize("api", ["anthropic"])
def test_the_anthropic_wire_runs_the_same_loop(tmp_path: Path, api: str) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    replies = ["Checking." + tool_call("read", path="a.txt"), "It says hello."]
    with scripted_server(replies) as server:
        agent, _ = make_agent(server.url, tmp_path)
        agent.model = ModelClient(server.url, api="anthropic")
        result = agent.run_turn("what does a.txt say?")
        assert result.text == "It says hello."
        assert agent.session.messages[2].content == "Checking."
        assert "hello" in agent.session.messages[3].content
        assert agent.session.usage.cached_tokens > 0
        agent.run_turn("bye")  # tool_use/tool_result history round-trips through the wire


class UnderEstimator(TokenEstimator):
    def __init__(self) -> None:
        super().__init__(chars_per_token=100.0)

    def calibrate(self, num_chars: int, num_tokens: int) -> None:
        pass


def _wait(predicate, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)
