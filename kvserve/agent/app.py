"""Assembles the agent (client, tools, session, loop) for a server URL and runs one task with `-p`;
`tui.py` runs the terminal UI over the same `AgentApp`."""

from __future__ import annotations

import json
import threading

from kvserve.agent import prompts
from kvserve.agent.client import ModelClient
from kvserve.agent.confirm import Confirmer, ConfirmPolicy, TimedPrompt
from kvserve.agent.interrupts import cancel_on_sigint
from kvserve.agent.loop import Agent, LoopConfig, Observer, TurnStatus
from kvserve.agent.messages import Message
from kvserve.agent.options import AgentOptions
from kvserve.agent.printer import ProgressPrinter
from kvserve.agent.session import Session, SessionError, SessionStore, new_session_name
from kvserve.agent.toolbox import Toolbox
from kvserve.agent.tools.base import ToolContext
from kvserve.agent.workspace import Workspace

EXIT_CODES = {TurnStatus.DONE: 0, TurnStatus.ERROR: 1, TurnStatus.MAX_STEPS: 1, TurnStatus.CANCELLED: 130}


class AgentApp:
    """Everything one agent run owns; `close()` stops background jobs and the HTTP client."""

    def __init__(
        self, url: str, options: AgentOptions, observer: Observer, confirmer: Confirmer | None = None
    ):
        self.options = options
        self.cancel = threading.Event()
        self.last_error: str | None = None  # why the last turn ended in error / max steps
        self.client = ModelClient(url, options.api, options.api_key, options.model)
        info = self.client.server_info()
        self.client.model = info.model
        self.store = SessionStore(options.sessions_dir)
        self.session = self._open_session(info.model)
        ctx = ToolContext(Workspace.create(options.cwd, options.allowed_paths), self.cancel)
        policy = ConfirmPolicy(options.is_yes, options.allowed_tools)
        confirmer = confirmer or TimedPrompt(timeout_s=options.confirm_timeout_s, cancel=self.cancel)
        self.toolbox = Toolbox(ctx, policy, confirmer, _optional_tools(ctx, info.supports_images))
        config = LoopConfig(
            info.context_length or options.fallback_ctx,
            options.max_tokens,
            options.max_steps,
            options.temperature,
            options.reasoning_effort,
            info.is_kvserve,
        )
        self.agent = Agent(self.client, self.toolbox, self.session, config, observer, self.cancel)

    def _open_session(self, model: str) -> Session:
        name = self.options.session
        if self.options.is_continue:
            name = self.store.last()
            if name is None:
                raise SessionError(f"no saved session to continue in {self.store.root}")
        if name is not None and self.store.exists(name):
            return self.store.load(name)
        system = prompts.SYSTEM.format(cwd=self.options.cwd)
        if self.options.system:
            system += "\n\n" + self.options.system
        return Session(name or new_session_name(), [Message("system", system)], str(self.options.cwd), model)

    def run_turn(self, text: str) -> TurnStatus:
        with cancel_on_sigint(self.cancel):
            result = self.agent.run_turn(text)
        self.last_error = result.error
        self.save()
        return result.status

    def save(self, name: str | None = None) -> None:
        if name is not None:
            self.agent.session.name = name
        self.store.save(self.agent.session)

    def close(self) -> None:
        self.toolbox.close()
        self.client.close()


def _optional_tools(ctx: ToolContext, supports_images: bool) -> list:
    """`visit_page` when Chromium is installed, `view_image` when the server's model takes images."""
    from kvserve.agent.tools.web import web_tools

    tools = web_tools(ctx)
    if supports_images:
        from kvserve.agent.tools.images import image_tools

        tools += image_tools(ctx)
    return tools


def run_print_mode(url: str, options: AgentOptions) -> int:
    """`kvserve agent -p TASK`: runs the task to completion; the exit code tells how it ended."""
    app = AgentApp(url, options, ProgressPrinter(is_quiet=options.is_json))
    try:
        status = app.run_turn(options.prompt or "")
        messages = app.agent.session.messages
        answer = next((m.content for m in reversed(messages) if m.role == "assistant"), "")
        if options.is_json:
            transcript = {
                "session": app.agent.session.name,
                "status": status.value,
                "result": answer,
                "error": app.last_error,  # the server's message when status is "error"
                "usage": vars(app.agent.session.usage),
                "messages": [m.to_json() for m in messages],
            }
            print(json.dumps(transcript, ensure_ascii=False, indent=1))
        else:
            print(answer)
        return EXIT_CODES[status]
    finally:
        app.close()
