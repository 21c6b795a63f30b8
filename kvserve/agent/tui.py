"""The interactive agent: a prompt-toolkit line editor with the status bar as its bottom toolbar,
a rich live view while the model works, slash commands, Ctrl+C to interrupt, Ctrl+D to quit."""

from __future__ import annotations

import sys

from prompt_toolkit import PromptSession
from prompt_toolkit.history import InMemoryHistory
from rich.console import Console

from kvserve.agent import commands
from kvserve.agent.app import AgentApp
from kvserve.agent.confirm import TimedPrompt
from kvserve.agent.loop import TurnStatus
from kvserve.agent.options import AgentOptions
from kvserve.agent.session import SessionError
from kvserve.agent.status import StatusBar
from kvserve.agent.view import StreamView


class Tui:
    def __init__(self, url: str, options: AgentOptions):
        self.console = Console(highlight=False)
        self.status = StatusBar(0)
        self.view = StreamView(self.console, self.status, lambda: self.app.agent.context_used())
        self.app = AgentApp(url, options, self.view, self._confirm)
        self.status.context_length = self.app.agent.config.context_length
        self.status.context_used = self.app.agent.context_used()
        self.status.cached_tokens = self.app.agent.session.usage.cached_tokens
        self.prompt = PromptSession(history=InMemoryHistory()) if sys.stdin.isatty() else None

    def _confirm(self, question: str) -> bool:
        self.view.pause()
        return TimedPrompt(sys.stdin, sys.stdout, self.app.options.confirm_timeout_s, self.app.cancel)(
            question
        )

    def run(self) -> int:
        self._banner()
        try:
            while True:
                line = self._read_line()
                if line is None:
                    break
                if not line.strip():
                    continue
                if line.startswith("/"):
                    if commands.handle(self.app, line, self._say) is commands.Outcome.QUIT:
                        break
                    continue
                self._turn(line)
        finally:
            self.view.pause()
            self.app.save()
            self.app.close()
            self.console.print(f"session saved: {self.app.agent.session.name}", style="dim")
        return 0

    def _turn(self, line: str) -> None:
        try:
            status = self.app.run_turn(line)
        finally:
            self.view.pause()
        if status is TurnStatus.CANCELLED:
            self.console.print("[interrupted]", style="yellow", markup=False)
        elif status is TurnStatus.MAX_STEPS:
            self.console.print("stopped: too many steps in one turn", style="yellow")
        self.console.print(self.status.text(), style="dim")

    def _read_line(self) -> str | None:
        while True:
            try:
                if self.prompt is None:
                    return input("> ")
                return self.prompt.prompt("> ", bottom_toolbar=self.status.text)
            except KeyboardInterrupt:
                continue  # Ctrl+C at the prompt clears the line
            except EOFError:
                return None

    def _banner(self) -> None:
        session = self.app.agent.session
        resumed = f", resumed ({len(session.messages)} messages)" if len(session.messages) > 1 else ""
        self.console.print(
            f"kvserve agent · {self.app.client.model} · ctx {self.status.context_length} · "
            f"session {session.name}{resumed} · {self.app.options.cwd}\n/help for commands",
            style="bold",
        )

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False)


def run_interactive(url: str, options: AgentOptions) -> int:
    try:
        return Tui(url, options).run()
    except SessionError as error:
        print(f"kvserve agent: {error}", file=sys.stderr)
        return 2
