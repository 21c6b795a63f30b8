"""`--max-num-seqs` / `--max-num-batched-tokens` 0 (the CLI default) become the device's defaults."""

from __future__ import annotations

import pytest

from kvserve.config import EngineConfig, SchedulerConfig, resolve


def _resolved(device: str, seqs: int, tokens: int) -> SchedulerConfig:
    config = EngineConfig(device=device, dtype="float32", scheduler=SchedulerConfig(seqs, tokens))
    return resolve(config).scheduler


def test_cpu_keeps_its_small_batch_and_short_steps_while_streams_decode() -> None:
    resolved = _resolved("cpu", 0, 0)
    assert resolved == SchedulerConfig(16, 2048, 512)
    assert resolved.budget_with_decodes == 512


def test_cuda_batches_like_vllm() -> None:
    assert _resolved("cuda", 0, 0) == SchedulerConfig(256, 8192)
    assert _resolved("cuda", 0, 0).budget_with_decodes == 8192
    assert _resolved("cuda:1", 0, 0) == SchedulerConfig(256, 8192)


def test_given_values_win_and_an_auto_budget_covers_the_batch() -> None:
    assert _resolved("cuda", 64, 2048) == SchedulerConfig(64, 2048)
    assert _resolved("cpu", 1024, 0) == SchedulerConfig(1024, 2048, 1024)
    assert _resolved("cpu", 4096, 0) == SchedulerConfig(4096, 4096)  # every step the same again
    given = _resolved("cpu", 0, 512)  # a budget given by hand holds for every step
    assert given == SchedulerConfig(16, 512) and given.budget_with_decodes == 512
    assert _resolved("cuda", 0, 1024) == SchedulerConfig(256, 1024)


def test_a_budget_below_the_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="max-num-batched-tokens"):
        _resolved("cpu", 64, 32)
