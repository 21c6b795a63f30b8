"""The model over HTTP: one streaming request per generation, to a kvserve (embedded or `--url`),
OpenAI-compatible or Anthropic-compatible server. The HTTP read runs in a worker thread so a
cancel (Ctrl+C) takes effect at once, even mid-prefill: the connection is closed, which makes the
server abort the request."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import httpx

from kvserve.agent.events import Finished, ModelRequest, StreamEvent
from kvserve.agent.sse_decode import AnthropicDecoder, OpenAIChatDecoder, StreamError, decode_comment
from kvserve.agent.wire import anthropic_body, openai_body

Api = Literal["openai", "anthropic"]
POLL_S = 0.05


class ModelError(Exception):
    """The server refused or failed the request; the message is the server's own."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code

    @property
    def is_context_overflow(self) -> bool:
        return self.code == "context_length_exceeded" or "prompt is too long" in str(self).lower()


@dataclass(frozen=True)
class ServerInfo:
    model: str
    context_length: int | None
    is_kvserve: bool
    supports_images: bool = False  # the entry's `modalities.vision` (kvserve; llama-server's shape)


class ModelClient:
    def __init__(
        self, base_url: str, api: Api = "openai", api_key: str | None = None, model: str | None = None
    ):
        self.base_url = base_url.rstrip("/")
        self.api = api
        headers = {"authorization": f"Bearer {api_key}", "x-api-key": api_key} if api_key else {}
        if api == "anthropic":
            headers["anthropic-version"] = "2023-06-01"
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(10.0, read=None))
        self.model = model

    def server_info(self) -> ServerInfo:
        """The served model, its context length (kvserve and vLLM report it) and whether it takes images
        (`modalities.vision`, kvserve only) from `/v1/models`."""
        try:
            response = self.http.get(f"{self._v1}/models")
            response.raise_for_status()
            data = response.json().get("data") or [{}]
        except (httpx.HTTPError, ValueError):
            return ServerInfo(self.model or "default", None, False)
        entry = next((m for m in data if m.get("id") == self.model), data[0])
        ctx = entry.get("context_length") or entry.get("max_model_len")
        model = self.model or entry.get("id") or "default"
        modalities = entry.get("modalities")
        vision = isinstance(modalities, dict) and modalities.get("vision") is True
        return ServerInfo(
            model, ctx if isinstance(ctx, int) else None, entry.get("owned_by") == "kvserve", vision
        )

    def stream(self, request: ModelRequest, cancel: threading.Event) -> Iterator[StreamEvent]:
        """The response's events; ends with `Finished("cancelled")` when `cancel` is set."""
        events: queue.Queue[StreamEvent | BaseException | None] = queue.Queue()
        holder: dict[str, httpx.Response] = {}
        worker = threading.Thread(target=self._read, args=(request, events, holder), daemon=True)
        worker.start()
        try:
            while True:
                if cancel.is_set():
                    yield Finished("cancelled")
                    return
                try:
                    item = events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            response = holder.get("response")
            if response is not None:
                response.close()  # the server sees the disconnect and aborts the request

    def close(self) -> None:
        self.http.close()

    @property
    def _v1(self) -> str:
        return self.base_url if self.base_url.endswith("/v1") else f"{self.base_url}/v1"

    def _read(self, request: ModelRequest, events: queue.Queue, holder: dict[str, httpx.Response]) -> None:
        model = self.model or "default"
        if self.api == "anthropic":
            url, body, decoder = f"{self._v1}/messages", anthropic_body(request, model), AnthropicDecoder()
        else:
            url, body, decoder = (
                f"{self._v1}/chat/completions",
                openai_body(request, model),
                OpenAIChatDecoder(),
            )
        try:
            with self.http.stream("POST", url, json=body) as response:
                holder["response"] = response
                if response.status_code != 200:
                    response.read()
                    message, code = _error_message(response)
                    raise ModelError(f"HTTP {response.status_code}: {message}", code)
                for line in response.iter_lines():
                    if line.startswith(":"):
                        events.put(decode_comment(line[1:]))
                    elif line.startswith("data:"):
                        for event in decoder.decode(line[5:].strip()):
                            events.put(event)
            events.put(None)
        except (httpx.HTTPError, StreamError, ModelError, ValueError) as error:
            events.put(
                error if isinstance(error, ModelError) else ModelError(str(error) or type(error).__name__)
            )
        except BaseException as error:  # noqa: BLE001 (handed to the consuming thread, which re-raises)
            events.put(error)


def _error_message(response: httpx.Response) -> tuple[str, str | None]:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text[:500], None
    if isinstance(error, dict):
        return str(error.get("message") or error), error.get("code")
    return str(error or response.text[:500]), None
