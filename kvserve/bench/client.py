"""Streaming HTTP client that timestamps every SSE chunk: OpenAI Chat, Completions, Anthropic Messages.

`StreamRecorder` is the pure part (feed it `data:` payloads with their arrival times, then ask for the
`RequestResult`); `stream_request` is the thin httpx shell around it. A stream counts as complete only
with a finish reason, usage (unless the rules waive it) and its end marker (`[DONE]` / `message_stop`),
and without an error event; anything else is a failed request with the reason in `error`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx

from kvserve.bench.endpoints import Api
from kvserve.bench.metrics import RequestResult


@dataclass(frozen=True)
class StreamRules:
    # llama-cpp-python's server sends no usage in streams; for it the output length falls back to
    # max_tokens when the length limit ended the stream, else to the number of content chunks, and
    # the prompt length to the client's own count.
    require_usage: bool = True


STRICT = StreamRules()


@dataclass(frozen=True)
class HttpRequest:
    api: Api
    body: dict[str, Any]
    prompt_len: int  # the client's own token count, used when the server reports no usage
    headers: tuple[tuple[str, str], ...] = ()  # e.g. an agent's session id (`bench multiturn`)


@dataclass(frozen=True)
class InlineImage:
    """An image inside a benchmark message's content list (beside plain `str` text parts);
    `request_body` writes it in each API's own shape."""

    media_type: str  # e.g. "image/png"
    data: str  # base64

    def wire(self, api: Api) -> dict[str, Any]:
        if api is Api.ANTHROPIC:
            source = {"type": "base64", "media_type": self.media_type, "data": self.data}
            return {"type": "image", "source": source}
        return {"type": "image_url", "image_url": {"url": f"data:{self.media_type};base64,{self.data}"}}


MessageContent = str | list[str | InlineImage]


class IncompleteStreamError(Exception):
    """The stream ended without what a complete response must carry."""


class StreamRecorder:
    """Accumulates one streamed response; times are `time.perf_counter()` values."""

    def __init__(self, api: Api, start: float, rules: StreamRules = STRICT) -> None:
        self.api, self.start, self.rules = api, start, rules
        self.first_content_at: float | None = None
        self.last_content_at: float | None = None
        self.itl: list[float] = []
        self.num_content_chunks = 0
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.is_done = False
        self.error: str | None = None

    def feed(self, payload: str, timestamp: float, event: str | None = None) -> None:
        """One SSE event: its `data:` payload and, if the server named it, its `event:` field."""
        if self.api is not Api.ANTHROPIC and payload.strip() == "[DONE]":
            self.is_done = True
            return
        try:
            data = json.loads(payload)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            self.error = self.error or f"malformed SSE data: {payload[:120]!r}"
            return
        if event == "error" or data.get("error") or data.get("type") == "error":
            self.error = self.error or f"error event: {json.dumps(data.get('error', data))[:300]}"
            return
        if self.api is Api.ANTHROPIC:
            self._feed_anthropic(data, timestamp)
        else:
            self._feed_openai(data, timestamp)

    def _feed_openai(self, data: dict[str, Any], timestamp: float) -> None:
        for choice in data.get("choices") or []:
            if self.api is Api.CHAT:
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                extra = delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
                self._content(text, timestamp, has_other=bool(extra))
            else:
                self._content(choice.get("text") or "", timestamp)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = details.get("cached_tokens")

    def _feed_anthropic(self, data: dict[str, Any], timestamp: float) -> None:
        kind = data.get("type")
        if kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            self.cached_tokens = usage.get("cache_read_input_tokens")
            self.prompt_tokens = (usage.get("input_tokens") or 0) + (self.cached_tokens or 0)
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            text = delta.get("text") or ""
            self._content(text, timestamp, has_other=bool(delta.get("thinking") or delta.get("partial_json")))
        elif kind == "message_delta":
            self.finish_reason = (data.get("delta") or {}).get("stop_reason") or self.finish_reason
            self.completion_tokens = (data.get("usage") or {}).get("output_tokens", self.completion_tokens)
        elif kind == "message_stop":
            self.is_done = True

    def _content(self, text: str, timestamp: float, has_other: bool = False) -> None:
        if not text and not has_other:
            return  # role-only preambles and empty keepalive deltas are not tokens
        if self.first_content_at is None:
            self.first_content_at = timestamp
        else:
            self.itl.append(timestamp - self.last_content_at)
        self.last_content_at = timestamp
        self.num_content_chunks += 1
        self.text.append(text)

    def check_complete(self) -> None:
        """Raises IncompleteStreamError naming the first thing missing."""
        if self.error:
            raise IncompleteStreamError(self.error)
        if self.finish_reason is None:
            raise IncompleteStreamError("stream ended without a finish reason")
        if self.rules.require_usage and self.completion_tokens is None:
            raise IncompleteStreamError("stream carried no usage (request asks for it)")
        if not self.is_done:
            end = "message_stop" if self.api is Api.ANTHROPIC else "[DONE]"
            raise IncompleteStreamError(f"stream ended without {end}")
        if self.first_content_at is None:
            raise IncompleteStreamError("stream carried no generated content")

    def result(self, fallback_prompt_len: int, max_tokens: int | None = None) -> RequestResult:
        """The request's result; a failed one (is_success False) when the stream is incomplete."""
        try:
            self.check_complete()
        except IncompleteStreamError as error:
            return RequestResult(
                is_success=False, prompt_len=fallback_prompt_len, output_len=0, error=str(error)
            )
        assert self.first_content_at is not None and self.last_content_at is not None
        output_len = self._output_len(max_tokens)
        return RequestResult(
            is_success=True,
            prompt_len=self.prompt_tokens if self.prompt_tokens is not None else fallback_prompt_len,
            output_len=output_len,
            ttft=self.first_content_at - self.start,
            itl=tuple(self.itl),
            latency=self.last_content_at - self.start,
            cached_tokens=self.cached_tokens,
            generated_text="".join(self.text),
        )

    def _output_len(self, max_tokens: int | None) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        # No usage: a stream cut by the length limit produced exactly max_tokens tokens; otherwise
        # count content chunks (a chunk may hold several tokens, e.g. a held-back multibyte char).
        if max_tokens is not None and self.finish_reason == "length":
            return max_tokens
        return self.num_content_chunks


async def stream_request(
    http: httpx.AsyncClient, base_url: str, request: HttpRequest, rules: StreamRules = STRICT
) -> RequestResult:
    """POST one streaming request and time its chunks. Network errors and non-200s are failures.

    One retry, on a new connection, when the server closed a pooled keep-alive connection before
    answering (RemoteProtocolError before any response): the request never reached it. Why: an HTTP
    server may close an idle connection just as the client reuses it (llama-server did, between
    two `bench context` frontiers: its log shows the request never arrived, and the frontier had
    no row). Any failure after the response began is the server's, and is not retried."""
    for attempt in (1, 2):
        start = time.perf_counter()
        recorder = StreamRecorder(request.api, start, rules)
        answered = False
        try:
            async with http.stream(
                "POST",
                base_url.rstrip("/") + request.api.path,
                json=request.body,
                headers=dict(request.headers),
            ) as response:
                answered = True
                if response.status_code != 200:
                    body = (await response.aread()).decode("utf-8", "replace")
                    return _failed(request, f"HTTP {response.status_code}: {body[:300]}")
                event: str | None = None
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        recorder.feed(line[5:].strip(), time.perf_counter(), event)
                        event = None
        except httpx.RemoteProtocolError as error:
            if attempt == 1 and not answered:
                continue
            return _failed(request, f"{type(error).__name__}: {error}")
        except httpx.HTTPError as error:
            return _failed(request, f"{type(error).__name__}: {error}")
        result = recorder.result(request.prompt_len, request.body.get("max_tokens"))
        return replace(result, served_by=response.headers.get(SERVED_BY_HEADER, ""))
    raise AssertionError("unreachable: the second attempt returns")


# `kvserve cluster` names the replica that answered (kvserve/cluster/ingress.py).
SERVED_BY_HEADER = "x-kvserve-replica"


def _failed(request: HttpRequest, reason: str) -> RequestResult:
    return RequestResult(is_success=False, prompt_len=request.prompt_len, output_len=0, error=reason)


def new_http_client(timeout_s: float = 3600.0, max_connections: int = 1024) -> httpx.AsyncClient:
    """One pooled client per benchmark; long read timeouts (CPU prefill of 12K tokens takes a while)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), limits=limits, trust_env=False)


def request_body(
    api: Api,
    prompt: str | list[dict[str, Any]],
    max_tokens: int,
    *,
    model: str | None = None,
    logit_bias: dict[str, float] | None = None,
    temperature: float = 0.0,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """A streaming body for `api`: a string prompt for Completions, messages for Chat and Anthropic.

    `logit_bias` (token id → bias) is how the benchmarks suppress end-of-sequence portably: llama-cpp-
    python's server has no `ignore_eos`, both servers honour OpenAI's `logit_bias`.
    """
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "stream": True}
    if model:
        body["model"] = model
    if api is Api.COMPLETIONS:
        assert isinstance(prompt, str), "Completions takes a text prompt"
        body["prompt"] = prompt
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else _wire(api, prompt)
        if api is Api.ANTHROPIC:
            system = [m["content"] for m in messages if m["role"] == "system"]
            body["messages"] = [m for m in messages if m["role"] != "system"]
            if system:
                body["system"] = "\n\n".join(system)
            body.setdefault("model", "kvserve")  # required by the Messages API
        else:
            body["messages"] = messages
    if api is not Api.ANTHROPIC:
        body["stream_options"] = {"include_usage": True}
        if logit_bias:
            body["logit_bias"] = logit_bias
        if ignore_eos:
            body["ignore_eos"] = True
    return body


def _wire(api: Api, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with list content (text and `InlineImage` parts) in `api`'s shape; string content as is,
    so a conversation without images is sent exactly as before."""
    return [
        m if isinstance(m["content"], str) else {**m, "content": _wire_parts(api, m["content"])}
        for m in messages
    ]


def _wire_parts(api: Api, parts: list[str | InlineImage]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": p} if isinstance(p, str) else p.wire(api) for p in parts]


async def warm_up(base_url: str, model: str | None, api: Api) -> RequestResult:
    """A 4-token request sharing nothing with any workload: kernel and allocator warm-up after a
    (re)start, so it never lands in a measurement."""
    async with new_http_client() as http:
        body = request_body(api, "Say hi.", 4, model=model)
        return await stream_request(
            http, base_url, HttpRequest(api, body, 4), StreamRules(require_usage=False)
        )
