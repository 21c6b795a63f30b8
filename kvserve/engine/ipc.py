"""The wire between the API front ends and the engine process (`process_client.py`,
`engine_process.py`).

Each message is one pickled object sent whole over a `multiprocessing` pipe (a Unix socket pair:
length-prefixed frames): a frozen dataclass per control message, each side dispatching on its
type with `match`; a type it does not handle raises `UnknownMessageError`.

front end -> engine: AddRequest  AbortRequest  Query  Tell  Gather  PeerAnswer  Shutdown
engine -> front end: Ready  StartFailed  StepOutputs  RequestFailed  Reply  PromptSourceFound
                     Tell (another front end's, forwarded)  Ask  EngineDied
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint, FinishReason
from kvserve.engine.sampling_params import SamplingParams

PROTOCOL = pickle.HIGHEST_PROTOCOL
_FINISH = tuple(FinishReason)
_FINISH_INDEX = {reason: i for i, reason in enumerate(_FINISH)}


class UnknownMessageError(TypeError):
    """A message of a type the receiving side does not handle: the two sides' code differ."""

    def __init__(self, message: object):
        super().__init__(f"unknown message on the engine pipe: {type(message).__name__}")


@dataclass(frozen=True)
class EngineInfo:
    """What the front end needs of the loaded engine (sent once, when the engine is ready)."""

    tokenizer: Any  # models.loaded.TokenizerInfo (its HF fast tokenizer pickles as its JSON)
    max_model_len: int
    vocab_size: int
    disk_dir: str | None  # the disk tier's directory; None without one
    num_front_ends: int = 1  # the API front ends that share the engine (`serve --api-servers`)
    image_prompt: Any = None  # serving.image_prompt.ImagePromptSpec of a vision model; None: text only


# -- front end -> engine -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    recipe: Any  # the token constraint's recipe (grammar.constraint), rebuilt in the engine; or None
    checkpoint_hint: CheckpointHint | None
    images: tuple[ImageInput, ...] = ()  # their pixels pickle as numpy arrays (ImageInput.__reduce__)


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True, slots=True)
class Query:
    """`query` (a typed question, e.g. cli.engine_host's) for the engine process's `answer`."""

    query_id: int
    query: Any


@dataclass(frozen=True, slots=True)
class Tell:
    """State one front end replicates to the others; the engine forwards it unchanged."""

    payload: Any


@dataclass(frozen=True, slots=True)
class Gather:
    """Ask every other front end `question` (a front end's own type, e.g.
    `api/front_end_questions.py`); the engine replies with the list of answers."""

    query_id: int
    question: object


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    """A front end's answer to an `Ask`."""

    ask_id: int
    value: Any


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


ToEngine = AddRequest | AbortRequest | Query | Tell | Gather | PeerAnswer | Shutdown


# -- engine -> front end -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True, slots=True)
class StartFailed:
    message: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The engine refused the request (its validation error, raised in the stream's consumer)."""

    request_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a `Query` or a `Gather`: `value`, or `error` raised in the asking thread."""

    query_id: int
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class PromptSourceFound:
    """Where the disk tier found a request's cached prefix, at its admission."""

    request_id: str
    num_ram_tokens: int
    num_disk_tokens: int
    checkpoint_id: str | None


@dataclass(frozen=True, slots=True)
class Ask:
    """Another front end's `Gather`, for this one to answer with a `PeerAnswer`."""

    ask_id: int
    question: object


@dataclass(frozen=True, slots=True)
class EngineDied:
    message: str


# NOTE: one step's outputs cross as a plain list of plain tuples (the list is their tag), not as
# dataclasses: at 256 streams and ~400 steps a second it is the one message whose cost counts, on
# both sides. Pickle + unpickle of a 256-output decode step (scripts/ipc_message_cost.py, one x86
# core): 81 µs as sent, 94 µs wrapped in a frozen slotted dataclass (a one-output step: 1.2 vs
# 9.3 µs), 1,215 µs with a frozen slotted dataclass per output, 1,035 µs as `EngineOutput`s.
StepOutputs = list[tuple[Any, ...]]

FromEngine = (
    Ready | StartFailed | StepOutputs | RequestFailed | Reply | PromptSourceFound | Tell | Ask | EngineDied
)


def dumps(message: ToEngine | FromEngine) -> bytes:
    return pickle.dumps(message, PROTOCOL)


def loads(data: bytes) -> object:
    return pickle.loads(data)


def encode_outputs(outputs: list[EngineOutput]) -> StepOutputs:
    """One step's outputs as plain tuples; the common decode output is (id, tokens, counters)."""
    encoded: StepOutputs = []
    for o in outputs:
        plain = (o.request_id, o.new_token_ids, o.num_prompt_tokens, o.num_cached_tokens)
        if (
            o.finish_reason is None
            and not o.new_logprobs
            and not o.num_computed_tokens
            and o.error is None
            and not o.num_cache_write_tokens
        ):
            encoded.append(plain)
        else:
            finish = None if o.finish_reason is None else _FINISH_INDEX[o.finish_reason]
            extra = (o.new_logprobs, finish, o.num_computed_tokens, o.error, o.num_cache_write_tokens)
            encoded.append(plain + extra)
    return encoded


def decode_output(item: tuple[Any, ...]) -> EngineOutput:
    if len(item) == 4:
        request_id, tokens, num_prompt, num_cached = item
        return EngineOutput(request_id, tokens, num_prompt_tokens=num_prompt, num_cached_tokens=num_cached)
    request_id, tokens, num_prompt, num_cached, logprobs, finish, num_computed, error, num_writes = item
    return EngineOutput(
        request_id,
        tokens,
        logprobs,
        None if finish is None else _FINISH[finish],
        num_prompt,
        num_cached,
        num_computed,
        error,
        num_writes,
    )
