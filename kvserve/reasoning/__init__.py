"""Reasoning segmentation: split generated text into reasoning and content (`<think>…</think>` and
family variants). Pure Python; imports nothing else from kvserve."""

from kvserve.reasoning.events import ContentChunk, ReasoningChunk, SegmentEvent
from kvserve.reasoning.segmenter import ReasoningSegmenter
from kvserve.reasoning.syntax import SYNTAXES, ReasoningSyntax, detect_reasoning, prompt_opens_reasoning

__all__ = [
    "SYNTAXES",
    "ContentChunk",
    "ReasoningChunk",
    "ReasoningSegmenter",
    "ReasoningSyntax",
    "SegmentEvent",
    "detect_reasoning",
    "prompt_opens_reasoning",
]
