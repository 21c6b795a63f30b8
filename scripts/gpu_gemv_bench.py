"""One-token projections of the Llama-3.2-1B shape on the GPU: cuBLAS (torch F.linear at M=1)
against the fused Triton GEMV (kvserve/models/layers/gemv.py), and a device copy of the same
bytes, all timed as CUDA-graph replays over 16 weight copies (one per layer, 1.9 GB in all, so
L2 holds none of them, as in a real decode step). Checks the Triton results first.
Run on the device machine: python3 scripts/gpu_gemv_bench.py"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.models.layers import gemv

HIDDEN, INTER, Q, KV, LAYERS = 2048, 8192, 2048, 512, 16
# name, rows, cols, fused extras
SHAPES = [
    ("qkv+norm", Q + 2 * KV, HIDDEN, "norm"),
    ("o+residual", HIDDEN, Q, "residual"),
    ("gate_up+norm+silu", 2 * INTER, HIDDEN, "gated"),
    ("down+residual", HIDDEN, INTER, "residual"),
]


def graph_time_us(fn, repeats: int = 50) -> float:
    """Median over `repeats` replays of a graph of fn() (all 16 layers), per layer, in us."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAYERS)
    return sorted(times)[len(times) // 2]


def bench_shape(name: str, n: int, k: int, extra: str) -> tuple:
    dtype, dev = torch.bfloat16, "cuda"
    weights = [torch.randn(n, k, device=dev).to(dtype) * k**-0.5 for _ in range(LAYERS)]
    x = torch.randn(1, k, device=dev).to(dtype)
    norm_w = (torch.randn(k, device=dev) * 0.1 + 1).to(dtype)
    out_n = n // 2 if extra == "gated" else n
    residual = torch.randn(1, out_n, device=dev).to(dtype)
    kwargs = {
        "norm": {"norm_weight": norm_w, "eps": 1e-5},
        "residual": {"residual": residual},
        "gated": {"norm_weight": norm_w, "eps": 1e-5, "gated": True},
    }[extra]
    # Correctness: against the unfused torch ops (HF rounding order), bf16 tolerance.
    w = weights[0]
    xn = norm_w * F.rms_norm(x.float(), (k,), None, 1e-5).to(dtype)
    if extra == "norm":
        want = F.linear(xn, w)
    elif extra == "residual":
        want = residual + F.linear(x, w)
    else:
        gate, up = F.linear(xn, w).chunk(2, dim=-1)
        want = F.silu(gate) * up
    got = gemv.gemv(x, w, **kwargs)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < 1e-2, (name, err)
    copies = [torch.empty_like(w) for w in weights]
    t_cublas = graph_time_us(lambda: [F.linear(x, w) for w in weights])
    t_triton = graph_time_us(lambda: [gemv.gemv(x, w, **kwargs) for w in weights])
    t_copy = graph_time_us(lambda: [c.copy_(w) for c, w in zip(copies, weights)])
    return name, n * k * 2 / 1e6, t_cublas, t_triton, t_copy, err, str(gemv._tuned_kernel.best_config)


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for shape in SHAPES:
        rows.append(bench_shape(*shape))
        torch.cuda.empty_cache()
    header = (
        f"{'projection':<20}{'MB':>7}{'cuBLAS us':>11}{'Triton us':>11}{'copy us':>9}  {'copy-speed':>10}"
    )
    print(header + "  rel.err  config")
    for name, mb, tc, tt, tcopy, err, config in rows:
        # copy-speed: the copy moves 2x the bytes (read + write), the GEMV reads them once.
        print(
            f"{name:<20}{mb:>7.1f}{tc:>11.2f}{tt:>11.2f}{tcopy:>9.2f}  {100 * tcopy / tt:>9.0f}%  {err:.1e}  {config}"
        )


if __name__ == "__main__":
    main()
