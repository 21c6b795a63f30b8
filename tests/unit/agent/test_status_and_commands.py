"""The status bar's numbers and the slash commands."""

from __future__ import annotations

from kvserve.agent.commands import Outcome, handle
from kvserve.agent.events import PrefillProgress, TextDelta
from kvserve.agent.messages import Usage
from kvserve.agent.status import GenerationStats, StatusBar


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_bar_text() -> None:
    clock = Clock()
    bar = StatusBar(8192, GenerationStats(clock), context_used=1200, cached_tokens=1000)
    assert bar.text() == "ctx 1200/8192 | generation 0 tokens | – t/s | cached 1000 | idle"
    bar.stats.start()
    clock.now += 0.5
    assert bar.text().endswith("prefill 0.5s")
    for _ in range(21):
        bar.stats.add(TextDelta("x"))
        clock.now += 0.1
    assert "generation 21 tokens | 9.5 t/s" in bar.text()
    bar.stats.end(Usage(prompt_tokens=1100, completion_tokens=21, cached_tokens=1000))
    assert bar.text().endswith("prefill 100 tok @ 200 t/s")


def test_the_prefill_bar_shows_the_servers_counts() -> None:
    clock = Clock()
    bar = StatusBar(8192, GenerationStats(clock))
    bar.stats.start()
    bar.stats.add(PrefillProgress(2000, 400, 1000, 2.0))  # 600 computed in 2 s
    assert bar.text().endswith("prefill [######------] 50% 1000/2000 @ 300 t/s")
    bar.stats.add(PrefillProgress(2000, 2000, 2000, 0.1))  # all cached: no speed to show
    assert bar.text().endswith("prefill [############] 100% 2000/2000")
    bar.stats.add(TextDelta("x"))  # the first token ends the prefill display
    assert "prefill 0.0s" in bar.text()
    bar.stats.start()
    assert bar.stats.prefill is None  # a new generation starts without the last one's counts


def test_cancelled_generations_have_no_usage() -> None:
    stats = GenerationStats(Clock())
    stats.start()
    stats.end(Usage())
    assert stats.usage is None


class FakeApp:
    """Just what the commands touch."""

    def __init__(self, tmp_path) -> None:
        from kvserve.agent.loop import LoopConfig
        from kvserve.agent.messages import Message
        from kvserve.agent.session import Session, SessionStore

        class Agent:
            pass

        self.store = SessionStore(tmp_path)
        self.agent = Agent()
        self.agent.session = Session("one", [Message("system", "s"), Message("user", "hello there")])
        self.agent.config = LoopConfig(4096)
        self.session = self.agent.session

    def save(self, name=None) -> None:
        if name:
            self.agent.session.name = name
        self.store.save(self.agent.session)


def test_commands(tmp_path) -> None:
    app, said = FakeApp(tmp_path), []
    assert handle(app, "/quit", said.append) is Outcome.QUIT
    assert handle(app, "/help", said.append) is Outcome.CONTINUE and "/compact" in said[-1]
    handle(app, "/history 1", said.append)
    assert said[-1] == "user: hello there"
    handle(app, "/think high", said.append)
    assert app.agent.config.reasoning_effort == "high" and said[-1] == "thinking: high"
    handle(app, "/think off", said.append)
    assert app.agent.config.reasoning_effort == "none"
    assert "usage" in (handle(app, "/think loud", said.append), said[-1])[1]
    handle(app, "/save two", said.append)
    assert said[-1] == "saved session two" and app.store.names() == ["two"]
    handle(app, "/clear", said.append)
    assert len(app.agent.session.messages) == 1 and app.agent.session.name != "two"
    handle(app, "/load two", said.append)
    assert app.agent.session.name == "two" and len(app.agent.session.messages) == 2
    handle(app, "/load nope", said.append)
    assert "no session named 'nope'" in said[-1]
    handle(app, "/frob", said.append)
    assert said[-1].startswith("unknown command /frob")
