"""What one API front end asks the others (`serve --api-servers N`), as types: the engine process
relays each question to every other front end (`EngineLink.gather`) and each answers in
`cli/api_servers.py`. Torch-free, so the console routes can ask them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """This front end's request metrics, summed into /metrics by the front end that serves it."""


@dataclass(frozen=True, slots=True)
class LiveRequests:
    """The requests in flight on this front end, for the console's list."""


@dataclass(frozen=True, slots=True)
class ConsoleRequests:
    """The console's /requests page (front end 0 holds the finished records)."""

    after: int
    limit: int


@dataclass(frozen=True, slots=True)
class ConsoleRequest:
    """One finished request's record (front end 0's)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class ConsoleHitRate:
    """The console's cache hit-rate series (front end 0's)."""


Question = MetricsSnapshot | LiveRequests | ConsoleRequests | ConsoleRequest | ConsoleHitRate
ConsoleQuestion = ConsoleRequests | ConsoleRequest | ConsoleHitRate


@dataclass(frozen=True, slots=True)
class PrimaryAnswer:
    """Front end 0's answer to a console question (the others answer None)."""

    value: Any
