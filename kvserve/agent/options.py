"""The agent's settings, from the command line, as one frozen object."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvserve.agent.client import Api


@dataclass(frozen=True)
class AgentOptions:
    cwd: Path
    sessions_dir: Path
    prompt: str | None = None  # -p: run this task and exit
    is_json: bool = False
    api: Api = "openai"
    api_key: str | None = None
    model: str | None = None  # None: the first model the server lists
    fallback_ctx: int = 32768  # when the server does not report its context length
    session: str | None = None
    is_continue: bool = False
    system: str | None = None
    is_yes: bool = False
    allowed_tools: frozenset[str] = frozenset()
    allowed_paths: tuple[str, ...] = ()
    confirm_timeout_s: float = 10.0
    max_tokens: int = 4096
    max_steps: int = 50
    temperature: float | None = None
    reasoning_effort: str | None = None
    is_embedded: bool = False
