"""The wire between the API front ends and the engine process (`process_client.py`,
`engine_process.py`).

Each message is one pickled tuple whose first item names it, sent whole over a
`multiprocessing` pipe (a Unix socket pair: length-prefixed frames). A step's outputs
travel as one message of plain tuples rather than as `EngineOutput` objects: at 256
streams and ~400 steps a second that is ~100K outputs a second, and pickling a tuple of
builtins costs a fraction of pickling a dataclass instance on either side.

front end -> engine: ("add", request_id, prompt_token_ids, params, recipe, checkpoint_hint)
                     ("abort", request_id)   ("query", query_id, name, args)   ("shutdown",)
                     ("tell", message)   ("gather", query_id, name, args)   ("answer", token, value)
engine -> front end: ("ready", EngineInfo)   ("fatal", message)   ("out", [output tuples])
                     ("error", request_id, exception)   ("reply", query_id, ok, value)
                     ("source", request_id, num_ram, num_disk, checkpoint_id)   ("dead", message)
                     ("told", message)   ("ask", token, name, args)
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import FinishReason

PROTOCOL = pickle.HIGHEST_PROTOCOL
_FINISH = tuple(FinishReason)
_FINISH_INDEX = {reason: i for i, reason in enumerate(_FINISH)}


@dataclass(frozen=True)
class EngineInfo:
    """What the front end needs of the loaded engine (sent once, when the engine is ready)."""

    tokenizer: Any  # models.loaded.TokenizerInfo (its HF fast tokenizer pickles as its JSON)
    max_model_len: int
    vocab_size: int
    disk_dir: str | None  # the disk tier's directory; None without one
    num_front_ends: int = 1  # the API front ends that share the engine (`serve --api-servers`)


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, PROTOCOL)


def loads(data: bytes) -> tuple[Any, ...]:
    return pickle.loads(data)


def encode_outputs(outputs: list[EngineOutput]) -> list[tuple[Any, ...]]:
    """One step's outputs as plain tuples; the common decode output is (id, tokens, counters)."""
    encoded: list[tuple[Any, ...]] = []
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
