"""Benchmark prompts: random tokens, shared-prefix repetition, a ShareGPT file (vLLM's dataset shapes).

Prompts are built with the served model's own tokenizer so their token counts are what the server
sees (give the same model the server runs: an alias, a GGUF or an HF folder).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Claude Code's request (system + tools): the agent-shaped prompt text of `multiturn` and `context`.
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "clients"
CLAUDE_CODE_FIXTURE = FIXTURES / "claude-code-2.1.332_messages.json"


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the benchmarks use."""

    all_special_ids: list[int]

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    prompt_len: int  # tokens of `prompt` without special tokens
    output_len: int  # max_tokens asked for


@dataclass(frozen=True)
class BenchTokenizer:
    tokenizer: Tokenizer
    stop_ids: tuple[int, ...]  # end-of-sequence / end-of-turn ids, suppressed through logit_bias

    def suppress_stop_bias(self) -> dict[str, float]:
        return {str(i): -100.0 for i in self.stop_ids}


def load_tokenizer(model: str) -> BenchTokenizer:
    """The tokenizer of a model spec (alias, GGUF file or HF folder), without loading weights."""
    from kvserve.models.loader import resolve_model_path
    from kvserve.models.loader.gguf_reader import read_gguf
    from kvserve.models.loader.tokenizer import load_gguf_tokenizer, load_hf_tokenizer

    path = resolve_model_path(model)
    info = load_hf_tokenizer(path) if path.is_dir() else load_gguf_tokenizer(path, read_gguf(path).metadata)
    return BenchTokenizer(info.tokenizer, tuple(info.eos_token_ids))


def random_tokens_text(tokenizer: Tokenizer, num_tokens: int, rng: random.Random) -> tuple[str, int]:
    """Text of about `num_tokens` random non-special tokens, and its exact re-tokenized length."""
    special = set(tokenizer.all_special_ids)
    vocab = len(tokenizer)
    ids: list[int] = []
    while len(ids) < num_tokens:
        token = rng.randrange(vocab)
        if token not in special:
            ids.append(token)
    # Decoding then re-encoding merges some pieces; trim to the budget so prompts never run long.
    text = tokenizer.decode(ids)
    reencoded = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    text = tokenizer.decode(reencoded)
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def random_dataset(
    tokenizer: Tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[BenchRequest]:
    """Lengths uniform in [len·(1−r), len·(1+r)] (vLLM's `--random-range-ratio`)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        n_in = rng.randint(max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio)))
        n_out = rng.randint(max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)))
        text, n = random_tokens_text(tokenizer, n_in, rng)
        requests.append(BenchRequest(text, n, n_out))
    return requests


def prefix_repetition_dataset(
    tokenizer: Tokenizer,
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
    seed: int = 0,
) -> list[BenchRequest]:
    """`num_prefixes` shared prefixes, each reused by num_prompts/num_prefixes prompts with random
    suffixes, shuffled: measures prefix caching under load."""
    if num_prefixes < 1 or num_prompts < num_prefixes:
        raise ValueError("need 1 <= num_prefixes <= num_prompts")
    rng = random.Random(seed)
    prefixes = [random_tokens_text(tokenizer, prefix_len, rng)[0] for _ in range(num_prefixes)]
    requests = []
    for i in range(num_prompts):
        suffix, _ = random_tokens_text(tokenizer, suffix_len, rng)
        text = prefixes[i % num_prefixes] + suffix
        requests.append(BenchRequest(text, len(tokenizer.encode(text, add_special_tokens=False)), output_len))
    rng.shuffle(requests)
    return requests


def sharegpt_dataset(
    tokenizer: Tokenizer,
    path: Path,
    num_prompts: int,
    output_len: int | None = None,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
    seed: int = 0,
) -> list[BenchRequest]:
    """First human turn of each conversation; output length = the reply's tokens unless fixed.
    Drops pairs shorter than 4 tokens or longer than the limits (vLLM's filter)."""
    conversations = [c for c in _read_sharegpt(path) if len(c) >= 2]
    random.Random(seed).shuffle(conversations)
    requests = []
    for turns in conversations:
        prompt = turns[0]
        prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False))
        reply_len = len(tokenizer.encode(turns[1], add_special_tokens=False))
        n_out = output_len if output_len is not None else reply_len
        if prompt_len < 4 or n_out < 4 or prompt_len > max_prompt_len or prompt_len + n_out > max_total_len:
            continue
        requests.append(BenchRequest(prompt, prompt_len, n_out))
        if len(requests) == num_prompts:
            break
    if len(requests) < num_prompts:
        raise ValueError(f"{path}: only {len(requests)} usable conversations, {num_prompts} asked for")
    return requests


def _read_sharegpt(path: Path) -> list[list[str]]:
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a ShareGPT JSON file ({error})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")  # noqa: TRY004 (bad input file)
    return [
        [str(turn.get("value", "")) for turn in entry.get("conversations", []) if isinstance(turn, dict)]
        for entry in data
        if isinstance(entry, dict)
    ]
