"""ChatServiceSettings: the knobs of a ChatService, built once (from `kvserve serve` flags and the
loaded model) and frozen. What ChatService talks to (engine, tokenizer, stores) is passed beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.chat.conversation import ChatRequest
from kvserve.reasoning import ReasoningSyntax
from kvserve.serving.engine_protocol import SamplingDefaults
from kvserve.serving.output_pipeline import PlainTextSegmenter, TextSegmenter
from kvserve.toolcalls.registry import DEFAULT_SYNTAX

if TYPE_CHECKING:
    from kvserve.serving.engine_protocol import ImagePromptSpec

# Given the chat request (tools offered? reasoning on?) and its rendered prompt (does it open a
# reasoning block?), the parser for the model's output syntax. The default passes text through.
SegmenterFactory = Callable[[ChatRequest, str], TextSegmenter]


def plain_text_segmenter(request: ChatRequest, prompt_text: str) -> TextSegmenter:
    return PlainTextSegmenter()


@dataclass(frozen=True, slots=True)
class ChatServiceSettings:
    model_name: str
    max_model_len: int  # prompt + output tokens of one request
    keepalive_s: float = 5.0  # the heartbeat while a prompt prefills (prefill progress, SSE keepalive)
    supports_images: bool = False
    # A vision model's prompt layout (placeholders expanded per image, each image's token span);
    # None: images are only checked, never run (a text model refuses them; tests' FakeEngine).
    image_prompt: ImagePromptSpec | None = None
    # The model's output syntax: the segmenter parses it; forced outputs (tool_choice, response_format)
    # follow `tool_syntax` and `reasoning_syntax`.
    segmenter_factory: SegmenterFactory = plain_text_segmenter
    tool_syntax: str = DEFAULT_SYNTAX
    reasoning_syntax: ReasoningSyntax | None = None
    vocab_size: int | None = None  # the width of the model's logits; None: the tokenizer's size
    # Caps every request's output tokens, whatever it asks for (--max-tokens-limit): clients such as
    # Codex send no output limit at all.
    max_tokens_limit: int | None = None
    # Fills each sampling parameter a request leaves out (Claude Code and Codex send none;
    # models/generation_config.py); the default holds the APIs' own neutral values.
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
