"""Tool-call parsing: one small module per model syntax behind one streaming state machine.

Pure Python; imports nothing else from kvserve (the serving layer adapts the events).
"""

from kvserve.toolcalls.events import CallArgs, CallEnd, CallStart, TextChunk, ToolEvent
from kvserve.toolcalls.registry import SYNTAXES, UnknownToolParserError, detect_parser, get_parser
from kvserve.toolcalls.stream import ToolCallParser

__all__ = [
    "SYNTAXES",
    "CallArgs",
    "CallEnd",
    "CallStart",
    "TextChunk",
    "ToolCallParser",
    "ToolEvent",
    "UnknownToolParserError",
    "detect_parser",
    "get_parser",
]
