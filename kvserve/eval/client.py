"""The eval's HTTP client: streaming OpenAI Chat Completions against kvserve (embedded) or any server.

Only wire dicts live here; what leaves is a typed `ModelOutput` or a `RequestFailed`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvserve.eval.grade import ModelOutput, ToolCall


class RequestFailed(Exception):
    """The server answered with an error, or the connection failed."""


@dataclass(frozen=True)
class ServerInfo:
    model: str
    context_length: int | None  # None when the server does not say


@dataclass(frozen=True)
class ChatSettings:
    temperature: float = 0.0
    seed: int | None = None
    reasoning_effort: str | None = None  # None: the server's default; "none" switches thinking off


@dataclass
class _Accumulator:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str = ""
    usage: dict[str, Any] = field(default_factory=dict)

    def add(self, chunk: dict[str, Any], on_text: Callable[[str], None]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            for key, sink in (("reasoning_content", self.reasoning), ("content", self.content)):
                if text := delta.get(key):
                    sink.append(text)
                    on_text(text)
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def output(self) -> ModelOutput:
        calls = tuple(ToolCall(c["name"], c["arguments"]) for _, c in sorted(self.calls.items()))
        return ModelOutput(
            "".join(self.content), "".join(self.reasoning), calls, self.finish_reason or "stop"
        )


class EvalClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        base = base_url.rstrip("/")
        base = base.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout_s)
        self._can_tokenize = True

    async def aclose(self) -> None:
        await self._http.aclose()

    async def server_info(self) -> ServerInfo:
        data = await self._get_json("/v1/models")
        model = (data.get("data") or [{}])[0]
        ctx = model.get("context_length") or model.get("max_model_len")
        return ServerInfo(str(model.get("id", "")), int(ctx) if ctx else None)

    async def count_tokens(self, text: str) -> int | None:
        """Tokens in `text` by the server's tokenizer (kvserve's and vLLM's /tokenize), or None."""
        if not self._can_tokenize:
            return None
        try:
            response = await self._http.post("/tokenize", json={"prompt": text})
        except httpx.HTTPError as error:
            raise RequestFailed(f"/tokenize: {error!r}") from error
        if response.status_code != 200:
            self._can_tokenize = False  # an OpenAI-only server: estimate instead
            return None
        return int(response.json()["count"])

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        max_tokens: int,
        settings: ChatSettings,
        tools: list[dict[str, Any]] | None = None,
        on_text: Callable[[str], None] = lambda _: None,
    ) -> tuple[ModelOutput, dict[str, Any]]:
        """One streamed completion; returns the output and the usage object."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": settings.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if settings.seed is not None:
            body["seed"] = settings.seed
        if settings.reasoning_effort is not None:
            body["reasoning_effort"] = settings.reasoning_effort
        if tools:
            body["tools"] = tools
        acc = _Accumulator()
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RequestFailed(f"HTTP {response.status_code}: {response.text[:300]}")
                async for line in response.aiter_lines():
                    if line.startswith("data:") and (payload := line[5:].strip()) != "[DONE]":
                        chunk = json.loads(payload)
                        if "error" in chunk:
                            raise RequestFailed(f"stream error: {chunk['error']}")
                        acc.add(chunk, on_text)
        except httpx.HTTPError as error:
            raise RequestFailed(f"{type(error).__name__}: {error}") from error
        return acc.output(), acc.usage

    async def _get_json(self, path: str) -> dict[str, Any]:
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as error:
            raise RequestFailed(f"{path}: {type(error).__name__}: {error}") from error
        if response.status_code != 200:
            raise RequestFailed(f"{path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()
