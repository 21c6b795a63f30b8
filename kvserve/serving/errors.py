"""Typed failures of ChatService that are the client's fault; the API maps each to a protocol 4xx."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the server will not run. `param` names the offending field when known; `status` is
    the HTTP status the API answers with (400, or 409 for state that vanished)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


class ContextLengthExceededError(RequestError):
    """The prompt fills the context (`n_prompt_tokens >= n_ctx`); raised before queueing."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int, param: str | None = None):
        super().__init__(
            f"Prompt has {n_prompt_tokens} tokens, but the configured context size is {n_ctx} tokens",
            param=param,
            code="context_length_exceeded",
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
