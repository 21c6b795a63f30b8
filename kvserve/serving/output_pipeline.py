"""Token ids -> GenerationEvents: detokenize (UTF-8 safe), stop strings (held back), segment.

The segmenter is the seam for reasoning and tool-call parsing: it receives
the visible text in order and turns it into events. Until a model-specific segmenter is
plugged in, `PlainTextSegmenter` makes every piece a TextDelta.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from kvserve.chat.detokenizer import IncrementalDetokenizer
from kvserve.chat.stop import StopMatcher
from kvserve.serving.events import FinishReason, GenerationEvent, TextDelta, ToolCallStart

# A parsed tool-call block's exact sampled markup and the ids of its calls (tool replay memory).
SampledBlock = tuple[str, tuple[str, ...]]


class TextSegmenter(Protocol):
    """Streaming parser over generated text: `feed` per piece, `finish` once at the end."""

    def feed(self, text: str) -> list[GenerationEvent]: ...

    def finish(self) -> list[GenerationEvent]: ...

    @property
    def sampled_blocks(self) -> list[SampledBlock]:
        """The tool-call blocks parsed so far, in output order ([] for a parser of no tool calls)."""
        ...


class PlainTextSegmenter:
    def feed(self, text: str) -> list[GenerationEvent]:
        return [TextDelta(text)] if text else []

    def finish(self) -> list[GenerationEvent]:
        return []

    @property
    def sampled_blocks(self) -> list[SampledBlock]:
        return []


class PipelineStep(NamedTuple):
    events: list[GenerationEvent]
    stopped: bool  # a stop string matched: the caller must stop generating


class OutputPipeline:
    def __init__(self, detokenizer: IncrementalDetokenizer, stop: StopMatcher, segmenter: TextSegmenter):
        self._detokenizer = detokenizer
        self._stop = stop
        self.segmenter = segmenter
        self.has_tool_calls = False

    @property
    def matched_stop(self) -> str | None:
        return self._stop.matched

    def push(self, token_ids: tuple[int, ...] | list[int]) -> PipelineStep:
        emit, stopped = self._stop.feed(self._detokenizer.push(token_ids))
        return PipelineStep(self._segment(emit), stopped)

    def finish(self) -> list[GenerationEvent]:
        """Flush everything held back; call once, after the last push."""
        if self._stop.is_stopped:
            text = ""
        else:
            emit, stopped = self._stop.feed(self._detokenizer.flush())
            text = emit if stopped else emit + self._stop.finish()
        events = self._segment(text) + self.segmenter.finish()
        self.has_tool_calls |= any(isinstance(e, ToolCallStart) for e in events)
        return events

    def finish_reason(self, engine_reason: FinishReason) -> FinishReason:
        """A stop string or parsed tool calls override the engine's reason."""
        if self._stop.is_stopped:
            return "stop"
        if self.has_tool_calls and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    def _segment(self, text: str) -> list[GenerationEvent]:
        events = self.segmenter.feed(text) if text else []
        self.has_tool_calls |= any(isinstance(e, ToolCallStart) for e in events)
        return events
