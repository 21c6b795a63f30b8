"""Datasets, arrival schedules, multi-turn session text and context-sweep prompts (pure, no server)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import pytest

from kvserve.bench.context_sweep import frontier_prompts, point
from kvserve.bench.datasets import prefix_repetition_dataset, random_dataset, sharegpt_dataset
from kvserve.bench.metrics import RequestResult
from kvserve.bench.multiturn import TurnResult, load_session_text, summarize_turns, user_turn_text
from kvserve.bench.serve_bench import LoadShape, arrival_offsets
from tests.unit.bench.char_tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_random_dataset_lengths_and_determinism() -> None:
    fixed = random_dataset(TOK, 5, input_len=40, output_len=7, seed=3)
    assert [(r.prompt_len, r.output_len) for r in fixed] == [(40, 7)] * 5
    assert all(len(r.prompt) == 40 and "\x00" not in r.prompt and "\x01" not in r.prompt for r in fixed)
    assert fixed == random_dataset(TOK, 5, input_len=40, output_len=7, seed=3)
    assert fixed != random_dataset(TOK, 5, input_len=40, output_len=7, seed=4)
    varied = random_dataset(TOK, 50, input_len=100, output_len=10, range_ratio=0.5, seed=1)
    assert all(50 <= r.prompt_len <= 150 and 5 <= r.output_len <= 15 for r in varied)
    assert len({r.prompt_len for r in varied}) > 5
    with pytest.raises(ValueError):
        random_dataset(TOK, 1, 10, 10, range_ratio=1.0)


def test_prefix_repetition_shares_prefixes() -> None:
    reqs = prefix_repetition_dataset(
        TOK, 12, prefix_len=30, suffix_len=5, num_prefixes=3, output_len=4, seed=0
    )
    assert len(reqs) == 12 and all(r.prompt_len == 35 and r.output_len == 4 for r in reqs)
    prefixes = [r.prompt[:30] for r in reqs]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in set(prefixes))
    assert len({r.prompt for r in reqs}) == 12
    with pytest.raises(ValueError):
        prefix_repetition_dataset(TOK, 2, 5, 5, num_prefixes=3, output_len=1)


def test_sharegpt_file_filters_and_fixes_lengths(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]
        },  # short
        {"conversations": [{"from": "human", "value": "a" * 50}, {"from": "gpt", "value": "b" * 20}]},
        {
            "conversations": [{"from": "human", "value": "c" * 3000}, {"from": "gpt", "value": "d" * 20}]
        },  # long
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversations": [{"from": "human", "value": "e" * 60}, {"from": "gpt", "value": "f" * 30}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    reqs = sharegpt_dataset(TOK, path, 2)
    assert sorted((r.prompt_len, r.output_len) for r in reqs) == [(50, 20), (60, 30)]
    assert all(r.output_len == 8 for r in sharegpt_dataset(TOK, path, 2, output_len=8))
    with pytest.raises(ValueError, match="only 2 usable"):
        sharegpt_dataset(TOK, path, 3)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        sharegpt_dataset(TOK, tmp_path / "bad.json", 1)


def test_arrivals_infinite_rate_poisson_and_bursty() -> None:
    assert arrival_offsets(4, LoadShape()) == [0.0] * 4
    offsets = arrival_offsets(4000, LoadShape(request_rate=10.0, seed=1))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.08)
    assert statistics.stdev(gaps) == pytest.approx(0.1, rel=0.12)  # exponential: std = mean
    bursty = arrival_offsets(4000, LoadShape(request_rate=10.0, burstiness=0.25, seed=1))
    bursty_gaps = [b - a for a, b in itertools.pairwise(bursty)]
    assert statistics.fmean(bursty_gaps) == pytest.approx(0.1, rel=0.15)
    assert statistics.stdev(bursty_gaps) > 1.5 * statistics.stdev(gaps)  # same rate, burstier
    assert offsets == arrival_offsets(4000, LoadShape(request_rate=10.0, seed=1))
    with pytest.raises(ValueError):
        arrival_offsets(2, LoadShape(request_rate=0.0))


def test_session_prefix_from_the_claude_code_fixture() -> None:
    text = load_session_text(TOK, 20_000)
    assert text.prefix_len == 20_000
    assert "x-anthropic-billing-header" not in text.system_prompt
    assert text.system_prompt.startswith("You are a Claude agent")
    assert '"name": "Bash"' in text.system_prompt  # the tools are in the prefix
    short = load_session_text(TOK, 1000)
    assert short.prefix_len == 1000 and text.system_prompt.startswith(short.system_prompt)


def test_user_turns_are_distinct_per_agent_and_turn() -> None:
    text = load_session_text(TOK, 2000)
    turns = {(a, t): user_turn_text(TOK, text, a, t, 200, seed=0) for a in range(3) for t in range(1, 4)}
    assert len(set(turns.values())) == len(turns)
    assert turns[(0, 1)].startswith("Agent 0:") and turns[(2, 3)].startswith("Tool result (call_2_2")
    assert turns[(1, 2)] == user_turn_text(TOK, text, 1, 2, 200, seed=0)


def test_summarize_turns() -> None:
    def tr(agent: int, turn: int, ttft: float, cached: int | None, ok: bool = True) -> TurnResult:
        result = RequestResult(ok, prompt_len=100, output_len=5 if ok else 0, ttft=ttft, cached_tokens=cached)
        return TurnResult(agent, turn, turn > 2, result)

    rows = [tr(0, 1, 2.0, 0), tr(1, 1, 4.0, 0), tr(0, 2, 0.1, 90), tr(1, 2, 0.3, 96), tr(0, 3, 0.2, None)]
    rows.append(tr(1, 3, 0.0, None, ok=False))
    s = summarize_turns(rows)
    assert [x.turn for x in s] == [1, 2, 3]
    assert s[0].p50_ttft_ms == pytest.approx(3000.0) and s[0].p50_cached_ratio == 0.0
    assert s[1].p50_ttft_ms == pytest.approx(200.0) and s[1].p50_cached_ratio == pytest.approx(0.93)
    assert s[2].num_ok == 1 and s[2].num_failed == 1 and s[2].p50_cached_ratio is None
    assert s[2].is_after_restart and not s[1].is_after_restart


def test_frontier_prompts_extend_each_other() -> None:
    prompts = frontier_prompts(TOK, [100, 500, 3000])
    assert [len(p) for p in prompts] == [100, 500, 3000]
    assert prompts[1].startswith(prompts[0]) and prompts[2].startswith(prompts[1])
    for bad in ([500, 100], [0, 10], [10, 10]):
        with pytest.raises(ValueError):
            frontier_prompts(TOK, bad)


def test_context_point_math() -> None:
    cached = RequestResult(True, prompt_len=2048, output_len=65, ttft=2.0, latency=4.0, cached_tokens=1024)
    p = point(2048, 1024, cached, 2048)
    assert p.prefilled_tokens == 1024 and not p.is_prefill_assumed
    assert p.prefill_tok_s == pytest.approx(512.0)
    assert p.decode_tok_s == pytest.approx(64 / 2.0)
    unknown = RequestResult(True, prompt_len=2048, output_len=65, ttft=1.0, latency=3.0)
    q = point(2048, 1024, unknown, 2048)
    assert q.is_prefill_assumed and q.prefilled_tokens == 1024 and q.prefill_tok_s == pytest.approx(1024.0)
    failed = point(4096, 2048, RequestResult(False, 4096, 0, error="HTTP 400"), 4096)
    assert failed.error == "HTTP 400" and math.isclose(failed.prefill_tok_s, 0.0)
