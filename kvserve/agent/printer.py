"""The non-interactive UI (`-p`): progress on stderr, the result (or a JSON transcript) on stdout."""

from __future__ import annotations

import sys
from typing import TextIO

from kvserve.agent.events import StreamEvent
from kvserve.agent.messages import ToolCall, Usage
from kvserve.agent.toolbox import ToolOutcome


class ProgressPrinter:
    def __init__(self, err: TextIO | None = None, is_quiet: bool = False):
        self.err = err or sys.stderr
        self.is_quiet = is_quiet

    def on_generation_start(self, kind: str) -> None:
        pass

    def on_stream_event(self, event: StreamEvent) -> None:
        pass

    def on_generation_end(self, usage: Usage) -> None:
        self._say(
            f"· {usage.prompt_tokens} prompt tokens ({usage.cached_tokens} cached), "
            f"{usage.completion_tokens} generated"
        )

    def on_tool_start(self, call: ToolCall) -> None:
        self._say(f"→ {call.name} {call.arguments[:200]}")

    def on_tool_end(self, call: ToolCall, outcome: ToolOutcome) -> None:
        first = outcome.text.splitlines()[0] if outcome.text else ""
        self._say(f"  {'✗' if outcome.is_error else '✓'} {first[:200]}")

    def on_notice(self, text: str) -> None:
        self._say(f"! {text}")

    def _say(self, text: str) -> None:
        if not self.is_quiet:
            print(text, file=self.err, flush=True)
