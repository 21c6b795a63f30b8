"""Request: the engine's mutable state for one generation, owned by the scheduler."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.image_input import ImageInput
from kvserve.engine.positions import PositionLayout
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.rope_scaling import TRAINED_ROPE_OFFSET


class RequestStatus(enum.IntEnum):
    """Ordered: every status after PREEMPTED is finished."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()  # the request's token constraint failed

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS or a stop token id
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # the token constraint rejected a token or failed (Request.error says why)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


@dataclass(frozen=True)
class Logprob:
    """Logprob of the sampled token plus the top alternatives (token_id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class CheckpointHint:
    """A client's request (kvserve's agent) for explicit disk checkpoints of this request:
    the system prompt + tools prefix (reason `agent_system`) once the prompt is prefilled, and
    the whole sequence, prompt and reply, when it finishes (`agent_session`). Ignored without
    a disk tier."""

    session_id: str | None = None
    save_system: bool = False
    save_session: bool = False


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[Logprob] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = -1  # prefix-cache hit at first scheduling; -1 until scheduled
    num_preemptions: int = 0
    max_model_len: int | None = None  # context limit; finishing with LENGTH when reached
    constraint: TokenConstraint | None = None  # grammar-constrained decoding; None: free
    error: str | None = None  # set with FINISHED_ERROR
    checkpoint_hint: CheckpointHint | None = None  # explicit disk checkpoints (agent sessions)
    overlap_limit: int | None = None  # engine/overlap.py's, computed at its first check
    images: tuple[ImageInput, ...] = ()  # in prompt order; their spans' placeholders take their rows
    # Runs with the model's trained RoPE, not the YaRN an on-demand context plan added: set by the
    # scheduler at admission, cleared when the sequence outgrows the trained context (rope_regime.py).
    uses_trained_rope: bool = False
    # Where a token's rotary position is not its index (images on M-RoPE grids); None: the index.
    position_layout: PositionLayout | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.position_layout = PositionLayout.of(self.images)

    @property
    def rope_offset(self) -> int:
        """What this request's regime adds to every rotary position (models/layers/rotary.py)."""
        return TRAINED_ROPE_OFFSET if self.uses_trained_rope else 0

    @property
    def decode_shift(self) -> int:
        """rotary position - index of the tokens after the prompt (what a decode step adds)."""
        shift = 0 if self.position_layout is None else self.position_layout.final_shift
        return shift + self.rope_offset

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self.status)
