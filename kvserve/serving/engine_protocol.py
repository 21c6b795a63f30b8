"""What ChatService needs from the engine and the tokenizer (structural, so tests can fake both).

The engine dataclasses (and the model's sampling defaults) are imported here, and only here, for
the layers above: they are plain Python (no torch), and `api/` reaches them only through `serving/`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint, Logprob
from kvserve.engine.request import FinishReason as EngineFinishReason
from kvserve.engine.sampling_params import SamplingParams, SamplingParamsError
from kvserve.models.generation_config import SamplingDefaults

__all__ = [
    "CheckpointHint",
    "EngineClientProtocol",
    "EngineFinishReason",
    "EngineOutput",
    "Logprob",
    "SamplingDefaults",
    "SamplingParams",
    "SamplingParamsError",
    "TokenConstraint",
    "TokenizerLike",
]


class EngineClientProtocol(Protocol):
    """`kvserve.engine.client.AsyncEngineClient` satisfies this.

    `generate` is an async generator function: calling it returns the iterator, and
    closing the iterator before the final output aborts the request in the engine.
    """

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
    ) -> AsyncIterator[EngineOutput]: ...


class TokenizerLike(Protocol):
    """`kvserve.models.loaded.TokenizerInfo` satisfies this; `tokenizer` is an HF fast tokenizer."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def chat_template(self) -> str | None: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def add_bos_token(self) -> bool: ...
