"""The streaming endpoints the HTTP benchmarks drive. Plain data (no httpx): `kvserve bench`'s
`--api` choices are read from it when the parser is built."""

from __future__ import annotations

import enum


class Api(enum.Enum):
    CHAT = "chat"  # POST /v1/chat/completions
    COMPLETIONS = "completions"  # POST /v1/completions
    ANTHROPIC = "anthropic"  # POST /v1/messages

    @property
    def path(self) -> str:
        return {
            "chat": "/v1/chat/completions",
            "completions": "/v1/completions",
            "anthropic": "/v1/messages",
        }[self.value]
