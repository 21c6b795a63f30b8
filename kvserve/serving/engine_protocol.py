"""What ChatService needs from the engine and the tokenizer (structural, so tests can fake both).

The engine dataclasses and client Protocol (and the model's sampling defaults) are imported here,
and only here, for the layers above: they are plain Python (no torch), and `api/` reaches them only
through `serving/`.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvserve.engine.client_protocol import EngineClient
from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint, Logprob
from kvserve.engine.request import FinishReason as EngineFinishReason
from kvserve.engine.sampling_params import SamplingParams, SamplingParamsError
from kvserve.models.generation_config import SamplingDefaults
from kvserve.models.vision.image_prompt import ImagePromptError, ImagePromptSpec, PromptImage
from kvserve.models.vision.prompt_image import engine_image_key

__all__ = [
    "CheckpointHint",
    "EngineClient",
    "EngineFinishReason",
    "EngineOutput",
    "ImageInput",
    "ImagePromptError",
    "ImagePromptSpec",
    "Logprob",
    "PromptImage",
    "SamplingDefaults",
    "SamplingParams",
    "SamplingParamsError",
    "TokenConstraint",
    "TokenizerLike",
    "engine_image_key",
]


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
