"""`kvserve bench quality` on a real EngineCore over the tiny random llama: the scored log-probs are
transformers' at the same positions, the reference against itself is KL 0 and top-1 100%, and a
lossier configuration gives a finite KL above 0."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from kvserve.bench.logit_scorer import LogitScorer
from kvserve.bench.perplexity import chunk_plan, chunk_tokens
from kvserve.bench.quality import ReferenceStore, ScoredText, reference_run, run_row
from kvserve.bench.quality_rows import ROWS, reference_config
from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from tests.engine.conftest import VOCAB, load_tiny


def _flags(path: Path) -> EngineConfig:
    # A 16-token step budget: a 64-token chunk's prompt takes four steps, as the scheduler cuts it.
    return EngineConfig(
        model=str(path),
        dtype="float32",
        device="cpu",
        cache=CacheConfig(kv_cache_memory_mb=16),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
    )


def _build(config: EngineConfig) -> EngineCore:
    return EngineCore(config, load_tiny(Path(config.model)))


def _text(mode: str) -> ScoredText:
    rng = random.Random(5)
    token_ids = [rng.randrange(VOCAB) for _ in range(200)]
    return ScoredText(token_ids, None, chunk_plan(len(token_ids), 64), mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["prompt", "decode", "reuse"])
def test_scored_log_probs_are_transformers_at_the_same_positions(
    tiny_llama_dir: Path, hf_tiny_llama, mode: str
) -> None:
    engine = _build(reference_config(_flags(tiny_llama_dir)))
    text = _text(mode)
    scorer = LogitScorer(engine, mode)  # type: ignore[arg-type]
    for chunk in text.chunks:
        tokens = chunk_tokens(text.token_ids, chunk, None)
        ours = scorer.logprobs(tokens, chunk.first_scored)  # [31, vocab]
        with torch.no_grad():
            logits = hf_tiny_llama(input_ids=torch.tensor([tokens])).logits[0].float()
        theirs = logits.log_softmax(-1)[chunk.first_scored : chunk.num_tokens - 1]
        assert ours.shape == theirs.shape == (chunk.num_scored, VOCAB)
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=0)


def test_the_reference_against_itself_is_kl_zero_and_a_lossier_row_is_not(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    flags = _flags(tiny_llama_dir)
    text = _text("decode")
    store = ReferenceStore(tmp_path / "reference")
    reference = reference_run(_build(reference_config(flags)), text, store)
    assert not reference.facts["reused"] and reference.logprobs.shape == (text.num_scored, VOCAB)

    itself = run_row(_build, "reference", "itself", reference_config(flags), text, reference)
    assert itself.comparison.kl_mean == itself.comparison.kl_max == 0.0
    assert itself.comparison.top1_agreement == 1.0 and itself.perplexity == reference.scores.perplexity

    fp16_kv = ROWS["fp16-kv"].config(reference_config(flags), reference.facts["model_context"])
    lossier = run_row(_build, "fp16-kv", "", fp16_kv, text, reference)
    assert lossier.settings["kv_dtype"] == "float16"
    assert 0.0 < lossier.comparison.kl_mean <= lossier.comparison.kl_p99 <= lossier.comparison.kl_max < 1e-2
    assert np.isfinite(lossier.perplexity) and lossier.comparison.top1_agreement > 0.9

    again = reference_run(_build(reference_config(flags)), text, store)  # the stored one, not a new run
    assert again.facts["reused"] and again.scores.perplexity == reference.scores.perplexity
    other = dataclasses.replace(text, mode="prompt")
    assert not reference_run(_build(reference_config(flags)), other, store).facts["reused"]
