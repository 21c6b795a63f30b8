"""Where the time goes on the GPU (Llama-3.2-1B shape, random weights): the kernels of an 8K
prefill and of one eager decode step, the graph replay time at batch 1, and the host share of
an engine decode step. Run on the device machine: python3 scripts/gpu_profile.py"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kvserve.bench.engine_bench import make_prompt
from kvserve.bench.shapes import build_hf_model, random_loaded_model
from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampler import greedy_argmax
from kvserve.engine.sampling_params import SamplingParams


def engine_for(loaded, eager: bool) -> EngineCore:
    config = EngineConfig(
        model="random",
        dtype="bfloat16",
        device="cuda",
        enforce_eager=eager,
        cache=CacheConfig(kv_cache_memory_mb=8192),
        scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192),
    )
    return EngineCore(config, loaded)


def kernel_table(prof, rows: int = 22) -> str:
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)


def start_decoding(engine: EngineCore, batch: int, vocab: int) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    requests = [engine.make_request(f"d{i}", make_prompt(128, vocab, i), params) for i in range(batch)]
    for r in requests:
        engine.add_request(r)
    while any(r.num_output_tokens == 0 for r in requests):
        engine.step()
    return requests


def argmax_ab(vocab: int) -> None:
    """One-row greedy argmax over the vocabulary inside a CUDA graph (100 calls per replay, as in
    the decode graph): torch's argmax against the two-stage greedy_argmax."""
    logits = torch.randn(1, vocab, device="cuda")
    for name, fn in (
        ("torch argmax", lambda: logits.argmax(-1)),
        ("greedy_argmax", lambda: greedy_argmax(logits)),
    ):
        assert torch.equal(fn(), logits.argmax(-1))
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(100):
                fn()
        times = []
        for _ in range(20):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) * 10)  # ms per 100 calls -> us per call
        print(f"in-graph {name}: {sorted(times)[10]:.2f} us per call")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-3.2-1b")
    args = parser.parse_args()
    hf = build_hf_model(args.shape, torch.bfloat16, "cuda")
    loaded = random_loaded_model(args.shape, hf, torch.bfloat16, "cuda")
    del hf
    vocab = loaded.arch.vocab_size
    eager = engine_for(loaded, eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for i in range(2):
        eager.generate([eager.make_request(f"w{i}", make_prompt(8192, vocab, 100 + i), params)])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager.generate([eager.make_request("p", make_prompt(8192, vocab, 7), params)])
    print("=== 8K prefill kernels")
    print(kernel_table(prof))

    start_decoding(eager, 1, vocab)
    for _ in range(5):
        eager.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            eager.step()
    print("=== eager decode x1, 10 steps")
    print(kernel_table(prof, 30))
    del eager
    torch.cuda.empty_cache()

    argmax_ab(vocab)
    engine = engine_for(loaded, eager=False)
    for batch in (1, 64, 256):
        requests = start_decoding(engine, batch, vocab)
        for _ in range(5):
            engine.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            engine.step()
        step_ms = (time.perf_counter() - start) / 50 * 1e3
        size = next(b for b in engine.runner.graphs.sizes if b >= batch)
        graph = engine.runner.graphs._graphs[size].graph
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(50):
            graph.replay()
        end.record()
        end.synchronize()
        replay_ms = begin.elapsed_time(end) / 50
        print(f"decode x{batch}: engine step {step_ms:.3f} ms, graph replay {replay_ms:.3f} ms")
        if batch in (1, 256):
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(50):
                engine.step()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
        for r in requests:
            engine.abort_request(r.request_id)
        engine.step()


if __name__ == "__main__":
    main()
