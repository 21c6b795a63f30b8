"""Wire-field conversions shared by the protocol adapters (each raises a 400 ApiError on bad input)."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from kvserve.api.errors import ApiError
from kvserve.chat.conversation import JsonFormat, ReasoningControl, SamplingOptions

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# The engine returns at most this many alternatives per token (OpenAI's limit too).
MAX_TOP_LOGPROBS = 20
_TOKEN_ID = re.compile(r"-?[0-9]{1,20}")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if s)


def max_tokens(value: int | None, param: str) -> int | None:
    if value is not None and value < 0:
        raise ApiError(400, f"{param} must be >= 0", param=param)
    return value


def logit_bias(value: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}`; ids are checked against the vocabulary by ChatService."""
    pairs = []
    for key, bias in (value or {}).items():
        if not _TOKEN_ID.fullmatch(key):
            raise ApiError(400, f"logit_bias: keys must be token ids, got {key!r}", param="logit_bias")
        if not math.isfinite(bias):
            raise ApiError(400, "logit_bias: values must be finite numbers", param="logit_bias")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def top_logprobs(value: int | None, param: str) -> int | None:
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"{param} must be in [0, {MAX_TOP_LOGPROBS}]", param=param)
    return value


def reasoning_from_effort(effort: str | None, param: str = "reasoning_effort") -> ReasoningControl:
    if effort is None:
        return ReasoningControl()
    if effort not in REASONING_EFFORTS:
        raise ApiError(400, f"{param} must be one of {', '.join(REASONING_EFFORTS)}", param=param)
    return ReasoningControl(enabled=effort != "none", effort=effort)


def arguments_text(arguments: str | dict[str, Any] | Any) -> str:
    """Tool-call arguments as JSON text: strings are kept verbatim, objects serialized compactly."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def openai_sampling(wire: Any, logprobs: int | None) -> SamplingOptions:
    """The sampling fields Chat Completions and Completions share (same names on both wires)."""
    return SamplingOptions(
        temperature=wire.temperature,
        top_p=wire.top_p,
        top_k=wire.top_k,
        min_p=wire.min_p,
        seed=wire.seed,
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        repetition_penalty=wire.repetition_penalty,
        logprobs=logprobs,
        logit_bias=logit_bias(wire.logit_bias),
        ignore_eos=wire.ignore_eos,
    )


def json_format(value: Any, param: str) -> JsonFormat | None:
    """OpenAI `response_format` ({"type", "json_schema": {"name", "schema"}}) or Responses
    `text.format` (the same, flat: {"type", "name", "schema"}) -> JsonFormat; None for plain text.
    The schema itself is checked when it is compiled (ChatService): a bad one is a 400 there."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, f"{param} must be an object", param=param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat()
    if kind != "json_schema":
        raise ApiError(
            400, f'{param}.type must be "text", "json_object" or "json_schema"', param=f"{param}.type"
        )
    holder, where = value, param
    if "json_schema" in value:  # Chat Completions nests it; Responses is flat
        holder, where = value["json_schema"], f"{param}.json_schema"
        if not isinstance(holder, dict):
            raise ApiError(400, f"{where} must be an object", param=where)
    schema = holder.get("schema")
    if schema is None:
        return JsonFormat()
    if not isinstance(schema, dict):
        raise ApiError(400, f"{where}.schema must be a JSON Schema object", param=f"{where}.schema")
    return JsonFormat(schema)
