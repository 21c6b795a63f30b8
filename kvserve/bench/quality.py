"""`kvserve bench quality`: what each fast path costs in accuracy, measured as llama-perplexity
measures quantizations: perplexity over a fixed text, and the KL divergence (mean, p99, max) and
top-1 agreement of each row's next-token distributions against a reference configuration (dense fp32
weights, fp32 KV, the model's own context), every row on kvserve's real engine (`logit_scorer.py`).

It lives under `bench/`, not `eval/`: it builds engines in-process (`eval/` only talks HTTP and
never imports the engine), and `kvserve bench` is where kvserve already runs llama.cpp beside
itself on the same GGUF.

The reference's log-probabilities are stored once on disk (`ReferenceStore`, fp32 so that the
reference against itself is exactly KL 0) and every row compares against them, as
llama-perplexity's `--kl-divergence-base` does.
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvserve.bench.perplexity import (
    Chunk,
    Comparison,
    Scores,
    chunk_tokens,
    compare,
    score,
    scored_targets,
)
from kvserve.bench.quality_rows import ScoreMode
from kvserve.config import EngineConfig

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore


@dataclass(frozen=True)
class ScoredText:
    """The tokens and the plan every row scores alike."""

    token_ids: list[int]
    bos_token_id: int | None  # put in place of each chunk's first token (llama-perplexity)
    chunks: list[Chunk]
    mode: ScoreMode

    @property
    def num_scored(self) -> int:
        return sum(c.num_scored for c in self.chunks)

    def key(self) -> dict:
        """What a stored reference must match to be reused."""
        digest = hashlib.sha256(np.asarray(self.token_ids, dtype=np.int64).tobytes()).hexdigest()
        return {"tokens_sha256": digest, "chunks": [list(c) for c in self.chunks], "mode": self.mode}


def score_engine(engine: EngineCore, text: ScoredText, out: np.ndarray) -> Scores:
    """Every chunk's log-probabilities into `out` [num_scored, vocab]; the scores of the true tokens."""
    from kvserve.bench.logit_scorer import LogitScorer

    scorer = LogitScorer(engine, text.mode)
    row = 0
    for chunk in text.chunks:
        logprobs = scorer.logprobs(chunk_tokens(text.token_ids, chunk, text.bos_token_id), chunk.first_scored)
        out[row : row + len(logprobs)] = logprobs.cpu().numpy()
        row += len(logprobs)
    assert row == len(out), (row, len(out))
    return score(out, scored_targets(text.token_ids, text.chunks))


class ReferenceStore:
    """The reference run's log-probabilities in a folder: `logprobs.npy` (fp32, [num_scored, vocab])
    and `meta.json` (the key it was made for, and its scores), written last."""

    def __init__(self, folder: Path):
        self.folder = folder

    def load(self, key: dict) -> tuple[np.ndarray, dict] | None:
        """The stored log-probabilities (memory-mapped) and facts when made for `key`, else None."""
        meta = self.folder / "meta.json"
        if not meta.is_file():
            return None
        stored = json.loads(meta.read_text())
        if stored["key"] != key:
            return None
        return np.load(self.folder / "logprobs.npy", mmap_mode="r"), stored["facts"]

    def create(self, shape: tuple[int, int]) -> np.ndarray:
        """A writable memory-mapped array for a new reference; `commit` marks it complete."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "meta.json").unlink(missing_ok=True)
        return np.lib.format.open_memmap(
            self.folder / "logprobs.npy", mode="w+", dtype=np.float32, shape=shape
        )

    def commit(self, key: dict, facts: dict, logprobs: np.ndarray) -> None:
        logprobs.flush()
        (self.folder / "meta.json").write_text(json.dumps({"key": key, "facts": facts}))


class Reference(NamedTuple):
    scores: Scores
    logprobs: np.ndarray  # [num_scored, vocab] fp32, memory-mapped from the store
    facts: dict  # settings, model_context, seconds, reused


def reference_run(engine: EngineCore, text: ScoredText, store: ReferenceStore) -> Reference:
    """The reference engine's log-probabilities: from `store` when it holds this model and text,
    else scored now and stored."""
    key = {
        "model": str(engine.loaded.path),
        "fingerprint": engine.loaded.fingerprint,
        "settings": engine_settings(engine),
        "step_tokens": engine.config.scheduler.max_num_batched_tokens,
        **text.key(),
    }
    found = store.load(key)
    targets = scored_targets(text.token_ids, text.chunks)
    if found is not None:
        logprobs, facts = found
        return Reference(score(logprobs, targets), logprobs, {**facts, "reused": True})
    start = time.perf_counter()
    logprobs = store.create((text.num_scored, engine.loaded.arch.vocab_size))
    scores = score_engine(engine, text, logprobs)
    facts = {
        "settings": engine_settings(engine),
        "model_context": engine.max_model_len,
        "seconds": time.perf_counter() - start,
    }
    store.commit(key, facts, logprobs)
    return Reference(scores, logprobs, {**facts, "reused": False})


@dataclass(frozen=True)
class RowResult:
    name: str
    what: str
    settings: dict  # the resolved engine settings the row ran with
    perplexity: float
    perplexity_stderr: float
    comparison: Comparison
    seconds: float

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "what": self.what,
            "settings": self.settings,
            "perplexity": self.perplexity,
            "perplexity_stderr": self.perplexity_stderr,
            **self.comparison._asdict(),
            "seconds": self.seconds,
        }


def engine_settings(engine: EngineCore) -> dict:
    config = engine.config
    return {
        "dtype": config.dtype,
        "weight_quant": config.weight_quant,
        "kv_dtype": config.cache.kv_dtype,
        "bf16_prefill": config.bf16_prefill,
        "int8_prefill": config.int8_prefill,
        "ctx": engine.max_model_len,
    }


def describe(settings: dict) -> str:
    """An engine's settings in a few words, for the table."""
    words = [settings["dtype"], f"{settings['weight_quant']} decode weights", f"{settings['kv_dtype']} KV"]
    words += ["bf16 prefill"] * settings["bf16_prefill"] + ["int8 prefill"] * settings["int8_prefill"]
    return ", ".join([*words, f"ctx {settings['ctx']}"])


def free_engine_memory() -> None:
    """After the last reference to an engine is dropped: collect it and give its CUDA memory back, so
    the next engine's KV pool, sized from the GPU's free memory, finds it free (torch's caching
    allocator would still hold it, and `cuda_kv_budget_bytes` counts held memory as in use)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_row(
    build: Callable[[EngineConfig], EngineCore],
    name: str,
    what: str,
    config: EngineConfig,
    text: ScoredText,
    reference: Reference,
) -> RowResult:
    """Build the row's engine, score the text, compare against the reference; the engine is freed."""
    start = time.perf_counter()
    engine = build(config)
    settings = engine_settings(engine)
    logprobs = np.empty((text.num_scored, engine.loaded.arch.vocab_size), dtype=np.float32)
    scores = score_engine(engine, text, logprobs)
    del engine
    free_engine_memory()
    comparison = compare(reference.scores, reference.logprobs, scores, logprobs)
    elapsed = time.perf_counter() - start
    return RowResult(name, what, settings, scores.perplexity, scores.perplexity_stderr, comparison, elapsed)
