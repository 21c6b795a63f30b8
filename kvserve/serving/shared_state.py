"""What one API front end remembers for the next turn of a conversation and tells the others
(`ChatService.share`, `ChatService.apply_shared`): that turn may land on any front end. Each message
crosses a process pipe, pickled."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.serving.live_sequences import LiveSequence
from kvserve.serving.output_pipeline import SampledBlock


@dataclass(frozen=True, slots=True)
class ToolCallsSampled:
    """For tool replay memory: the exact markup of a turn's tool-call blocks."""

    blocks: tuple[SampledBlock, ...]


@dataclass(frozen=True, slots=True)
class LiveSequenceSaved:
    """For live tool continuation: the exact sequence of a turn that ended in tool calls."""

    sequence: LiveSequence


SharedState = ToolCallsSampled | LiveSequenceSaved
