"""`EngineClient`: what the serving side and the server's CLI use of an engine, whichever
transport runs it (`client.AsyncEngineClient`: an engine thread in this process;
`process_client.EngineLink` / `ProcessEngineClient`: the engine process).

Torch-free, so `serving/` (through `serving/engine_protocol.py`) and `cli/` can import it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint
from kvserve.engine.sampling_params import SamplingParams


@runtime_checkable
class EngineClient(Protocol):
    """`generate` is an async generator function: calling it returns the iterator, and closing the
    iterator before the final output aborts the request in the engine."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncIterator[EngineOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def shutdown(self, timeout: float = 120.0) -> None:
        """Stop the engine (or, for one front end of several, leave it); the disk tier saves."""
        ...

    @property
    def is_running(self) -> bool: ...
