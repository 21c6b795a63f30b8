"""The model-output segmenter the OutputPipeline plugs in: reasoning first, then tool calls.

Order is the guarantee: only text the reasoning segmenter calls content ever reaches the tool-call
parser, so markup inside reasoning is never executed. Tool events get their call ids here (the pure
parsers know none), and the exact sampled markup of each call is kept for tool replay memory.

Wiring: `ChatServiceSettings(segmenter_factory=OutputSyntax.detect(template, tool_parser).segmenter)`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.chat.conversation import ChatRequest
from kvserve.reasoning import (
    ContentChunk,
    ReasoningChunk,
    ReasoningSegmenter,
    ReasoningSyntax,
    SegmentEvent,
    detect_reasoning,
    prompt_opens_reasoning,
)
from kvserve.serving.events import (
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from kvserve.serving.output_pipeline import SampledBlock
from kvserve.toolcalls import (
    SYNTAXES as TOOL_SYNTAXES,
)
from kvserve.toolcalls import (
    CallArgs,
    CallEnd,
    CallStart,
    TextChunk,
    ToolCallParser,
    ToolEvent,
    UnknownToolParserError,
    detect_parser,
    get_parser,
)


def new_call_id() -> str:
    """32 lowercase hex (16 random bytes); encoders add `call_`/`toolu_`."""
    return secrets.token_hex(16)


class ModelOutputSegmenter:
    """A TextSegmenter (output_pipeline.py): generated text -> GenerationEvents."""

    def __init__(
        self,
        reasoning: ReasoningSegmenter | None,
        tool_calls: ToolCallParser | None,
        call_id_factory: Callable[[], str] = new_call_id,
    ):
        self._reasoning = reasoning
        self._tool_calls = tool_calls
        self._call_id_factory = call_id_factory
        self._ids: dict[int, str] = {}
        # call id -> the exact sampled markup of its block, for tool replay memory.
        self.sampled_calls: dict[str, str] = {}
        self._blocks: dict[int, tuple[str, list[str]]] = {}  # block number -> (markup, its call ids)

    def feed(self, text: str) -> list[GenerationEvent]:
        if self._reasoning is None:
            return self._content(text)
        return self._route(self._reasoning.feed(text))

    def finish(self) -> list[GenerationEvent]:
        events = self._route(self._reasoning.finish()) if self._reasoning is not None else []
        if self._tool_calls is not None:
            events += [self._tool_event(e) for e in self._tool_calls.finish()]
        return events

    def _route(self, chunks: list[SegmentEvent]) -> list[GenerationEvent]:
        events: list[GenerationEvent] = []
        for chunk in chunks:
            if isinstance(chunk, ReasoningChunk):
                events.append(ReasoningDelta(chunk.text))
            else:
                assert isinstance(chunk, ContentChunk)
                events += self._content(chunk.text)
        return events

    def _content(self, text: str) -> list[GenerationEvent]:
        if self._tool_calls is None:
            return [TextDelta(text)] if text else []
        return [self._tool_event(e) for e in self._tool_calls.feed(text)]

    def _tool_event(self, event: ToolEvent) -> GenerationEvent:
        if isinstance(event, TextChunk):
            return TextDelta(event.text)
        if isinstance(event, CallStart):
            call_id = self._ids[event.index] = self._call_id_factory()
            return ToolCallStart(event.index, call_id, event.name)
        if isinstance(event, CallArgs):
            return ToolCallArgsDelta(event.index, event.fragment)
        assert isinstance(event, CallEnd)
        call_id = self._ids[event.index]
        if not event.aborted:  # an aborted call's block came back as text: there is no markup to replay
            self.sampled_calls[call_id] = event.raw
            self._blocks.setdefault(event.block, (event.raw, []))[1].append(call_id)
        return ToolCallEnd(event.index, event.arguments)

    @property
    def sampled_blocks(self) -> list[SampledBlock]:
        """Each parsed block's exact markup and the ids of its calls, in output order."""
        return [(raw, tuple(ids)) for raw, ids in self._blocks.values()]


@dataclass(frozen=True)
class OutputSyntax:
    """How one model writes reasoning and tool calls; chosen once at start-up from its chat template."""

    tool_parser: str
    reasoning: ReasoningSyntax | None

    @classmethod
    def detect(cls, chat_template: str | None, tool_parser: str | None = None) -> OutputSyntax:
        """`tool_parser` (the --tool-parser flag) overrides the template's choice."""
        if tool_parser is not None and tool_parser not in TOOL_SYNTAXES:
            raise UnknownToolParserError(
                f"unknown tool parser {tool_parser!r}; choose one of {', '.join(TOOL_SYNTAXES)}"
            )
        return cls(tool_parser or detect_parser(chat_template), detect_reasoning(chat_template))

    def describe(self) -> str:
        """For the start-up log line."""
        if self.reasoning is None:
            return f"tool parser {self.tool_parser}, no reasoning markup"
        where = " (opened by the prompt)" if self.reasoning.opens_in_prompt else ""
        return (
            f"tool parser {self.tool_parser}, reasoning {self.reasoning.open}…{self.reasoning.close}{where}"
        )

    def segmenter(self, request: ChatRequest, prompt_text: str = "") -> ModelOutputSegmenter:
        """The SegmenterFactory: tool calls are parsed only when tools are offered. Whether the output
        starts inside a reasoning block is read off the rendered prompt when there is one."""
        tools = request.active_tools
        parser = get_parser(self.tool_parser, tools) if tools else None
        reasoning = None
        if self.reasoning is not None:
            if prompt_text:
                inside = prompt_opens_reasoning(prompt_text, self.reasoning)
            else:  # the template's guess; it writes a closed block instead when thinking is off
                inside = self.reasoning.opens_in_prompt and request.reasoning.enabled is not False
            reasoning = ReasoningSegmenter(self.reasoning, starts_in_reasoning=inside)
        return ModelOutputSegmenter(reasoning, parser)
