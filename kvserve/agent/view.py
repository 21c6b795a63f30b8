"""The interactive UI's live view of a generation (rich): streaming Markdown, reasoning dimmed, tool
calls as they parse, and the status bar under them; tool runs and notices print as plain lines."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from kvserve.agent.events import ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta
from kvserve.agent.messages import ToolCall, Usage
from kvserve.agent.status import StatusBar
from kvserve.agent.toolbox import ToolOutcome

MAX_RESULT_LINES = 4


class StreamView:
    def __init__(self, console: Console, status: StatusBar, context_used: Callable[[], int]):
        self.console = console
        self.status = status
        self.context_used = context_used
        self.live: Live | None = None
        self.kind = "answer"
        self.text = ""
        self.reasoning = ""
        self.calls: dict[int, list[str]] = {}

    # --- Observer -----------------------------------------------------------------------------

    def on_generation_start(self, kind: str) -> None:
        self.kind, self.text, self.reasoning, self.calls = kind, "", "", {}
        self.status.stats.start()
        self.live = Live(
            console=self.console,
            get_renderable=self._render,
            refresh_per_second=8,
            vertical_overflow="visible",
            transient=False,
        )
        self.live.start()

    def on_stream_event(self, event: StreamEvent) -> None:
        self.status.stats.add(event)
        match event:
            case TextDelta(text):
                self.text += text
            case ReasoningDelta(text):
                self.reasoning += text
            case ToolCallDelta(index, _, name, arguments):
                call = self.calls.setdefault(index, ["", ""])
                call[0] = name or call[0]
                call[1] += arguments

    def on_generation_end(self, usage: Usage) -> None:
        self.status.stats.end(usage)
        self.status.cached_tokens = usage.cached_tokens
        self.status.context_used = self.context_used()
        self.pause()

    def on_tool_start(self, call: ToolCall) -> None:
        self.console.print(Text(f"⚙ {call.name} {call.arguments[:200]}", style="bold cyan"))

    def on_tool_end(self, call: ToolCall, outcome: ToolOutcome) -> None:
        lines = outcome.text.splitlines() or [""]
        shown = "\n".join(f"  {line[:200]}" for line in lines[:MAX_RESULT_LINES])
        more = f"\n  … {len(lines) - MAX_RESULT_LINES} more lines" if len(lines) > MAX_RESULT_LINES else ""
        self.console.print(Text(shown + more, style="red" if outcome.is_error else "dim"))
        self.status.context_used = self.context_used()

    def on_notice(self, text: str) -> None:
        self.pause()
        self.console.print(Text(f"! {text}", style="yellow"))

    # --- display ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stops the live region (its last frame stays on screen) so plain output can follow."""
        live, self.live = self.live, None
        if live is not None:
            live.stop()  # renders a last frame, without the status line now that self.live is None

    def _render(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.kind == "summary":
            parts.append(Text(f"compacting… {self.status.stats.num_generated} tokens", style="yellow"))
        else:
            if self.reasoning:
                parts.append(Text(self.reasoning, style="dim italic"))
            if self.text:
                parts.append(Markdown(self.text))
            for name, arguments in self.calls.values():
                parts.append(Text(f"⚙ {name} {arguments[:200]}", style="cyan"))
        if self.live is not None:  # the status line lives only while generating
            parts.append(Text(self.status.text(), style="reverse"))
        return Group(*parts)
