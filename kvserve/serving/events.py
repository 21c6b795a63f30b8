"""GenerationEvent: the one typed stream every protocol encoder consumes.

Order of a stream: zero or more PrefillProgress while the prompt prefills; a first Usage
(completion_tokens=0) once prefill is done, so encoders that announce cache numbers up
front (Anthropic message_start) can; content events (with Logprobs, when asked, before the
text of the tokens they describe); a final Usage; then exactly one terminal event,
Finished or Failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """`id` is protocol-neutral (32 hex); each encoder adds its prefix (`call_`, `toolu_`)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgsDelta:
    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """`arguments` is the complete JSON text; the streamed fragments concatenate to it when any were sent."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_write_tokens: int = 0  # prompt tokens this request stored in disk checkpoints

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class Finished:
    reason: FinishReason
    stop_sequence: str | None = None  # the stop string that ended generation, if one did


@dataclass(frozen=True, slots=True)
class Failed:
    """Generation broke after it started (engine died); encoders end the stream with an error event."""

    error: str


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """Sent once per keepalive interval while the prompt prefills (encoders write an SSE keepalive),
    and after prefill chunks when the request asked for progress (`is_detailed`: encoders then
    write the counts in an SSE comment, which every SDK skips).

    Counts are the engine's latest report; `num_computed_tokens` includes the cached prefix.
    """

    num_prompt_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    elapsed_s: float
    is_detailed: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Prefill speed over the tokens actually computed (cache hits excluded)."""
        computed = self.num_computed_tokens - self.num_cached_tokens
        return computed / self.elapsed_s if self.elapsed_s > 0 and computed > 0 else 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's logprob, its text and exact UTF-8 bytes (a token may hold part of a
    character), and, for a sampled token, the most likely alternatives (best first)."""

    token: str
    token_bytes: tuple[int, ...]
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Logprobs of newly sampled tokens, in order (only when the request asked for them)."""

    tokens: tuple[TokenLogprob, ...]


GenerationEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallStart
    | ToolCallArgsDelta
    | ToolCallEnd
    | Usage
    | Finished
    | Failed
    | PrefillProgress
    | Logprobs
)
