"""Completions wire <-> TextRequest / GenerationEvents."""

from __future__ import annotations

import time
from typing import Any

from kvserve.api.errors import ApiError
from kvserve.api.extension import server_hints
from kvserve.api.openai_chat.adapter import usage_json
from kvserve.api.openai_completions.schema import CompletionRequest
from kvserve.api.request_fields import json_format, max_tokens, openai_sampling, stop_list, top_logprobs
from kvserve.api.sse import DONE, FrameTemplate, data_frame, prefill_comment
from kvserve.chat.conversation import GenerationOptions, TextRequest
from kvserve.serving.events import (
    Failed,
    Finished,
    GenerationEvent,
    Logprobs,
    PrefillProgress,
    TextDelta,
    TokenLogprob,
    Usage,
)
from kvserve.serving.result import GenerationResult


def to_text_request(wire: CompletionRequest) -> TextRequest:
    for name in ("n", "best_of"):
        if getattr(wire, name) not in (None, 1):
            raise ApiError(400, f"only {name}=1 is supported", param=name)
    if wire.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if isinstance(wire.prompt, list):
        if len(wire.prompt) != 1:
            raise ApiError(400, "exactly one prompt is supported per request", param="prompt")
        prompt = wire.prompt[0]
    else:
        prompt = wire.prompt
    options = GenerationOptions(
        sampling=openai_sampling(wire, top_logprobs(wire.logprobs, "logprobs")),
        stop=stop_list(wire.stop),
        max_tokens=max_tokens(wire.max_tokens, "max_tokens"),
        hints=server_hints(wire.kvserve),
    )
    return TextRequest(prompt, options, json_format(wire.response_format, "response_format"))


def logprobs_json(tokens: list[TokenLogprob], text_offset: int = 0) -> dict[str, Any]:
    """The legacy `choices[].logprobs`; `text_offset` is where the first token starts in the completion."""
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{alt.token: alt.logprob for alt in t.top} for t in tokens],
        "text_offset": offsets,
    }


def to_response(
    result: GenerationResult, completion_id: str, model: str, logprobs: bool = False
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "text": result.text,
                "index": 0,
                "logprobs": logprobs_json(result.logprobs) if logprobs else None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": usage_json(result.usage),
    }


class CompletionStreamEncoder:
    """GenerationEvents -> `text_completion` SSE chunks; logprobs ride on the next chunk (see chat)."""

    def __init__(self, completion_id: str, model: str, include_usage: bool):
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        self._usage: Usage | None = None
        self._logprobs: list[TokenLogprob] = []
        self._text_offset = 0  # where the next logprobs token starts in the completion
        choice = {"text": FrameTemplate.MARKER, "index": 0, "logprobs": None, "finish_reason": None}
        self._text_frame = FrameTemplate(self._envelope([choice]))

    def start(self) -> list[str]:
        return []

    def encode(self, event: GenerationEvent) -> list[str]:
        match event:
            case TextDelta(text):
                return [self._chunk(text, None) if self._logprobs else self._text_frame.frame(text)]
            case Usage():
                self._usage = event
            case Logprobs(tokens):
                self._logprobs.extend(tokens)
            case Finished(reason):
                frames = [self._chunk("", reason)]
                if self.include_usage and self._usage is not None:
                    frames.append(data_frame({**self._envelope([]), "usage": usage_json(self._usage)}))
                return [*frames, DONE]
            case Failed(error):
                return [
                    data_frame(
                        {"error": {"message": error, "type": "server_error", "param": None, "code": None}}
                    ),
                    DONE,
                ]
            case PrefillProgress():
                return [prefill_comment(event)]
        return []

    def _chunk(self, text: str, finish_reason: str | None) -> str:
        logprobs = None
        if self._logprobs:
            logprobs = logprobs_json(self._logprobs, self._text_offset)
            self._text_offset += sum(len(t.token) for t in self._logprobs)
            self._logprobs = []
        choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
        return data_frame(self._envelope([choice]))

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
