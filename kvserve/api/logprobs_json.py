"""The per-token logprob object Chat Completions and Responses share:
`{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`."""

from __future__ import annotations

from typing import Any

from kvserve.serving.events import TokenLogprob


def token_logprob_json(token: TokenLogprob) -> dict[str, Any]:
    return {**_entry(token), "top_logprobs": [_entry(alt) for alt in token.top]}


def _entry(token: TokenLogprob) -> dict[str, Any]:
    return {"token": token.token, "logprob": token.logprob, "bytes": list(token.token_bytes)}
