"""Metric math on synthetic timestamps (vLLM benchmark_serving definitions)."""

from __future__ import annotations

import pytest

from kvserve.bench.client import Api, StreamRecorder
from kvserve.bench.metrics import SLO, RequestResult, compute_metrics, parse_slo, stats_ms


def _completion_stream(start: float, times: list[float], usage_tokens: int | None = None) -> RequestResult:
    """A Completions stream with one text chunk at each absolute time, then finish + usage + [DONE]."""
    recorder = StreamRecorder(Api.COMPLETIONS, start)
    for t in times:
        recorder.feed('{"choices":[{"index":0,"text":"x","finish_reason":null}]}', t)
    recorder.feed('{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', times[-1] + 0.001)
    n = len(times) if usage_tokens is None else usage_tokens
    recorder.feed(
        f'{{"choices":[],"usage":{{"prompt_tokens":10,"completion_tokens":{n}}}}}', times[-1] + 0.002
    )
    recorder.feed("[DONE]", times[-1] + 0.003)
    return recorder.result(fallback_prompt_len=99)


def test_ttft_itl_latency_and_tpot_from_chunk_times() -> None:
    r = _completion_stream(100.0, [100.5, 100.6, 100.8, 101.1])
    assert r.is_success
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx((0.1, 0.2, 0.3))
    assert r.latency == pytest.approx(1.1)  # start -> last content chunk (not the usage chunk)
    assert r.output_len == 4 and r.prompt_len == 10
    assert r.tpot == pytest.approx((1.1 - 0.5) / 3)


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # A server may put several tokens in one chunk: TPOT divides by the server's token count.
    r = _completion_stream(0.0, [1.0, 2.0], usage_tokens=11)
    assert r.output_len == 11
    assert r.tpot == pytest.approx(1.0 / 10)


def test_single_token_output_has_zero_tpot_and_is_left_out_of_tpot_stats() -> None:
    one = _completion_stream(0.0, [0.2])
    two = _completion_stream(0.0, [0.2, 0.4])
    assert one.tpot == 0.0
    m = compute_metrics([one, two], duration_s=1.0)
    assert m.tpot_ms.mean == pytest.approx(200.0)
    assert m.ttft_ms.mean == pytest.approx(200.0)


def test_aggregates_throughput_percentiles_and_failures() -> None:
    ok = [
        RequestResult(True, prompt_len=100, output_len=10, ttft=t, itl=(0.01,) * 9, latency=t + 0.09)
        for t in (0.1, 0.2, 0.3, 0.4, 1.0)
    ]
    failed = RequestResult(False, prompt_len=100, output_len=0, error="stream ended without [DONE]")
    m = compute_metrics([*ok, failed], duration_s=2.0)
    assert (m.num_completed, m.num_failed) == (5, 1)
    assert m.total_input_tokens == 500 and m.total_output_tokens == 50
    assert m.request_throughput == pytest.approx(2.5)
    assert m.output_throughput == pytest.approx(25.0)
    assert m.total_token_throughput == pytest.approx(275.0)
    assert m.ttft_ms.median == pytest.approx(300.0)
    assert m.ttft_ms.mean == pytest.approx(400.0)
    # numpy's linear interpolation: p90 of [100,200,300,400,1000] = 400 + 0.6 * 600
    assert m.ttft_ms.p90 == pytest.approx(760.0)
    assert m.ttft_ms.p99 == pytest.approx(976.0)
    assert m.itl_ms.mean == pytest.approx(10.0)
    assert m.tpot_ms.mean == pytest.approx(10.0)
    assert m.e2el_ms.median == pytest.approx(390.0)
    assert m.errors == ("stream ended without [DONE]",)
    assert m.request_goodput is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    results = [
        RequestResult(True, 1, 11, ttft=0.1, latency=0.1 + 10 * 0.02),  # tpot 20 ms
        RequestResult(True, 1, 11, ttft=0.1, latency=0.1 + 10 * 0.06),  # tpot 60 ms: misses tpot
        RequestResult(True, 1, 11, ttft=0.9, latency=0.9 + 10 * 0.02),  # misses ttft
        RequestResult(True, 1, 1, ttft=0.2, latency=0.2),  # tpot counts as 0
    ]
    m = compute_metrics(results, duration_s=4.0, slo=SLO(ttft_ms=500, tpot_ms=50))
    assert m.request_goodput == pytest.approx(2 / 4.0)
    e2e = compute_metrics(results, duration_s=1.0, slo=SLO(e2el_ms=400))
    assert e2e.request_goodput == pytest.approx(2.0)


def test_goodput_slo_is_inclusive_like_vllm() -> None:
    # vLLM counts a request as good when `slo >= value`: one exactly at its SLO meets it.
    at_limit = RequestResult(True, 1, 3, ttft=0.5, latency=1.0)  # ttft 500 ms, tpot 250 ms (exact in binary)
    just_over = RequestResult(True, 1, 3, ttft=0.5, latency=1.001)
    m = compute_metrics([at_limit, just_over], duration_s=1.0, slo=SLO(ttft_ms=500, tpot_ms=250))
    assert m.request_goodput == pytest.approx(1.0)


def test_empty_stats_are_zero_like_vllm() -> None:
    assert stats_ms([]).mean == 0.0
    m = compute_metrics([RequestResult(False, 5, 0, error="x")], duration_s=1.0)
    assert m.num_completed == 0 and m.ttft_ms.p99 == 0.0


def test_parse_slo() -> None:
    assert parse_slo(None) is None
    assert parse_slo(["ttft:500", "e2el:2000"]) == SLO(ttft_ms=500.0, e2el_ms=2000.0)
    for bad in (["ttft"], ["itl:5"], ["tpot:-1"], ["tpot:abc"]):
        with pytest.raises(ValueError):
            parse_slo(bad)
