"""The last frames of an SSE stream whose replica died mid-answer: an error in the protocol's own
shape, then the protocol's end, so every SDK raises a clean error instead of waiting for more."""

from __future__ import annotations

from kvserve.api.errors import anthropic_error_body, is_anthropic_path, openai_error_body
from kvserve.api.sse import DONE, data_frame, event_frame

# 503: the server is unavailable for this request; Anthropic's type for it is `overloaded_error`,
# which Claude Code retries, and the retry is routed to a live replica.
_STATUS = 503


def failure_frames(path: str, message: str) -> list[str]:
    if is_anthropic_path(path):
        return [event_frame("error", anthropic_error_body(_STATUS, message))]
    body = openai_error_body(_STATUS, message)
    if path == "/v1/responses":
        # The Responses `error` event, with the `error` object the OpenAI SDK raises on.
        error = body["error"]
        return [event_frame("error", {"type": "error", "code": error["type"], "message": message, **body})]
    return [data_frame(body), DONE]
