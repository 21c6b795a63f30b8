"""Slash commands of the interactive agent."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import replace

from kvserve.agent.app import AgentApp
from kvserve.agent.messages import Message
from kvserve.agent.session import Session, SessionError, new_session_name

HELP = """/help                 this list
/history [N]          the last N messages (default 3)
/save [NAME]          save the session (optionally under a new name)
/load NAME            switch to a saved session
/sessions             list saved sessions
/think on|off|EFFORT  reasoning (efforts: minimal low medium high xhigh max)
/compact              summarize the older conversation now
/clear                start a new session
/quit                 exit (the session is saved)
Ctrl+C interrupts the generation or tool in flight; Ctrl+D quits."""

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


class Outcome(enum.Enum):
    CONTINUE = "continue"
    QUIT = "quit"


Say = Callable[[str], None]


def handle(app: AgentApp, line: str, say: Say) -> Outcome:
    name, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    handler = _COMMANDS.get(name)
    if handler is None:
        say(f"unknown command {name}; /help lists them")
        return Outcome.CONTINUE
    return handler(app, rest, say) or Outcome.CONTINUE


def _help(app: AgentApp, rest: str, say: Say) -> None:
    say(HELP)


def _quit(app: AgentApp, rest: str, say: Say) -> Outcome:
    return Outcome.QUIT


def _history(app: AgentApp, rest: str, say: Say) -> None:
    count = int(rest) if rest.isdigit() else 3
    for message in app.agent.session.messages[-min(count, 200) :]:
        say(describe(message))


def describe(message: Message) -> str:
    calls = " ".join(f"[{c.name} {c.arguments[:80]}]" for c in message.tool_calls)
    text = message.content.strip().replace("\n", " ")
    tag = f"{message.role}{' (internal)' if message.is_internal else ''}"
    return f"{tag}: {text[:300]}{'…' if len(text) > 300 else ''} {calls}".rstrip()


def _save(app: AgentApp, rest: str, say: Say) -> None:
    try:
        app.save(rest or None)
    except SessionError as error:
        say(str(error))
        return
    say(f"saved session {app.agent.session.name}")


def _load(app: AgentApp, rest: str, say: Say) -> None:
    if not rest:
        say("usage: /load NAME (/sessions lists them)")
        return
    try:
        session = app.store.load(rest)
    except SessionError as error:
        say(str(error))
        return
    app.save()
    switch_session(app, session)
    say(f"loaded session {session.name} ({len(session.messages)} messages)")


def _sessions(app: AgentApp, rest: str, say: Say) -> None:
    names = app.store.names()
    say("\n".join(names[:50]) if names else "no saved sessions")


def _think(app: AgentApp, rest: str, say: Say) -> None:
    effort = {"on": "medium", "off": "none"}.get(rest, rest)
    if effort not in EFFORTS:
        say("usage: /think on|off|" + "|".join(EFFORTS[1:]))
        return
    app.agent.config = replace(app.agent.config, reasoning_effort=effort)
    say(f"thinking: {'off' if effort == 'none' else effort}")


def _compact(app: AgentApp, rest: str, say: Say) -> None:
    from kvserve.agent.interrupts import cancel_on_sigint

    app.cancel.clear()
    with cancel_on_sigint(app.cancel):
        is_done = app.agent.compact()
    app.save()
    say("compacted" if is_done else "not compacted")


def _clear(app: AgentApp, rest: str, say: Say) -> None:
    app.save()
    old = app.agent.session
    switch_session(app, Session(new_session_name(), old.messages[:1], old.cwd, old.model))
    say(f"new session {app.agent.session.name}")


def switch_session(app: AgentApp, session: Session) -> None:
    app.session = session
    app.agent.session = session
    app.agent.num_counted = len(session.messages) if session.usage.prompt_tokens else 0


_COMMANDS: dict[str, Callable[[AgentApp, str, Say], Outcome | None]] = {
    "/help": _help,
    "/quit": _quit,
    "/exit": _quit,
    "/history": _history,
    "/save": _save,
    "/load": _load,
    "/sessions": _sessions,
    "/think": _think,
    "/compact": _compact,
    "/clear": _clear,
}
