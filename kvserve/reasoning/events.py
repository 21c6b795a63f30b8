"""What a reasoning segmenter emits; the serving layer maps these to its GenerationEvents."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningChunk:
    text: str


@dataclass(frozen=True, slots=True)
class ContentChunk:
    """Text after the reasoning block (or all of it when the model did not reason)."""

    text: str


SegmentEvent = ReasoningChunk | ContentChunk
