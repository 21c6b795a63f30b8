"""`kvserve bench engine --device cuda --shape NAME`: kvserve on a random-weight model of a named
shape, beside Hugging Face transformers (eager: no torch.compile, its default SDPA attention) on
the same weights, with the copy-bandwidth roofline measured in the same run.

Roofline: the time of one device-to-device copy of the weight bytes gives the bandwidth
(bytes read + bytes written over time); single-stream decode must read every weight once
per token, so bandwidth / weight bytes bounds its tok/s.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from kvserve.bench.engine_bench import EngineBenchResult, make_prompt


@dataclass
class Roofline:
    weight_bytes: int
    copy_bandwidth_gb_s: float  # (read + write) / time of a device memcpy of the weight bytes
    decode_tok_s_batch1: float  # bandwidth / weight bytes

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class GpuInfo:
    name: str
    torch: str
    triton: str | None
    transformers: str
    extra: dict = field(default_factory=dict)


def measure_copy_roofline(weight_bytes: int, repeats: int = 20) -> Roofline:
    n = weight_bytes // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")  # never zeros: see METHOD.md
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = sorted(times[3:])[len(times[3:]) // 2]  # median after warm-up
    del src, dst
    torch.cuda.empty_cache()
    bandwidth = 2 * n * 2 / seconds
    return Roofline(weight_bytes, bandwidth / 1e9, bandwidth / weight_bytes)


@torch.inference_mode()
def bench_hf(
    hf: torch.nn.Module,
    vocab: int,
    prefill_lens: list[int],
    concurrency: list[int],
    decode_tokens: int,
    repeats: int,
) -> EngineBenchResult:
    """Prefill: one forward over N tokens keeping the last logits (what generate() does).
    Decode at batch B: (generate(N new) - generate(1 new)) per new token after the first."""
    result = EngineBenchResult(engine="transformers")
    seed = 5000
    _hf_prefill(hf, make_prompt(64, vocab, seed))  # warm-up
    for n in prefill_lens:
        best = 0.0
        for _ in range(repeats):
            seed += 1
            best = max(best, n / _hf_prefill(hf, make_prompt(n, vocab, seed)))
        result.prefill_tok_s[n] = best
    for batch in concurrency:
        seed += 100
        ids = torch.tensor([make_prompt(128, vocab, seed + i) for i in range(batch)], device="cuda")
        _hf_generate(hf, ids, 2)  # warm-up at this batch size
        one = min(_hf_generate(hf, ids, 1) for _ in range(repeats))
        full = min(_hf_generate(hf, ids, decode_tokens) for _ in range(repeats))
        result.decode_tok_s[batch] = batch * (decode_tokens - 1) / max(full - one, 1e-9)
    return result


def _hf_prefill(hf: torch.nn.Module, prompt: list[int]) -> float:
    ids = torch.tensor([prompt], device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    hf(ids, logits_to_keep=1).logits.argmax(-1).tolist()
    return time.perf_counter() - start


def _hf_generate(hf: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    torch.cuda.synchronize()
    return time.perf_counter() - start


def gpu_info() -> GpuInfo:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return GpuInfo(torch.cuda.get_device_name(), torch.__version__, triton_version, transformers.__version__)
