"""Completions request wire model."""

from __future__ import annotations

from typing import Any

from kvserve.api.extension import KvserveExtension
from kvserve.api.openai_chat.schema import StreamOptions
from kvserve.api.wire import WireModel

# OpenAI's documented default for this endpoint.
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(WireModel):
    prompt: str | list[str]
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    response_format: dict[str, Any] | None = None  # vLLM's extension: json_object / json_schema
    kvserve: KvserveExtension | None = None  # kvserve's own extension (api/extension.py)
