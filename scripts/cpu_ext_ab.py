"""A/B of two versions of the CPU kernels (kvserve/models/layers/csrc) in one engine, interleaved:
the working tree's against the sources of a git revision, built under another extension name.

    PYTHONPATH=. .venv/bin/python scripts/cpu_ext_ab.py --before HEAD~1 --threads 1

SmolLM2 fp32 `--weight-quant int4`, one stream decoding; the two builds take turns every `--steps`
steps on the same engine (same weights, same KV), so both see the same machine load; first it checks
that the two builds' attention and x4 GEMV give the same bits (`--no-bit-check` skips it). The revision's
kernels must take the arguments the working tree's Python passes them (same signatures).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from kvserve.bench.engine_bench import make_prompt
from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.build import build_engine
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext, lowbit_cpu

CSRC = "kvserve/models/layers/csrc"


def build_revision(revision: str, folder: Path) -> Any:
    """The kernels of `revision`, compiled in `folder` with cpu_ext's sources and flags."""
    from torch.utils import cpp_extension

    src = folder / "src"
    src.mkdir(parents=True)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{revision}:{CSRC}"], check=True, capture_output=True, text=True
    ).stdout.split()
    for name in names:
        blob = subprocess.run(["git", "show", f"{revision}:{CSRC}/{name}"], check=True, capture_output=True)
        # pybind11 registers a C++ class once per process: the second build's DecodeStack must be local
        text = blob.stdout.replace(b'(m, "DecodeStack")', b'(m, "DecodeStack", pybind11::module_local())')
        (src / name).write_bytes(text)
    return cpp_extension.load(
        name="kvserve_cpu_kernels_ab_before",
        sources=[str(src / name) for name in cpu_ext._SOURCES],
        extra_include_paths=[str(src)],
        extra_cflags=list(cpu_ext._CFLAGS),
        build_directory=str(folder),
        verbose=False,
    )


def _call(kernel: Any, args: tuple, later_args: tuple) -> Any:
    """A kernel call with the arguments added since (Gemma's q/k norms, GELU, output norms, at their
    defaults), or without them for a revision that predates them."""
    try:
        return kernel(*args, *later_args)
    except TypeError:
        return kernel(*args)


def check_same_bits(before: Any, after: Any) -> None:
    """The two builds' decode attention (SmolLM2's heads) and x4 GEMV give equal bits on random inputs:
    a kernel change meant to be exact is checked here, not only timed."""
    torch.manual_seed(0)
    heads, kv_heads, dim, block_size, seqs = 9, 3, 64, 16, 3
    seq_lens = torch.tensor([37, 300, 5])
    tables = torch.arange(seqs * 20).view(seqs, 20)
    slots = (
        tables[torch.arange(seqs), (seq_lens - 1) // block_size] * block_size + (seq_lens - 1) % block_size
    )
    qkv = torch.randn(seqs, (heads + 2 * kv_heads) * dim)
    cos, sin = torch.randn(seqs, dim), torch.randn(seqs, dim)
    cache = torch.randn(2, seqs * 20, block_size, kv_heads, dim)
    outs = []
    for ext in (before, after):
        args = (qkv, cos, sin, cache.clone(), slots, tables, seq_lens, heads, kv_heads, dim**-0.5, 0)
        outs.append(_call(ext.decode_attention, args, (None, None, 1e-6)))  # no q/k norms
    qweight, scales = lowbit_cpu.quantize(torch.randn(3072, 576) * 0.05, 4)
    packed, x = lowbit_cpu.pack_for_decode(qweight, scales, 4), torch.randn(1, 576)
    args = (x, qweight, scales, 4, None, None, None, 1e-6, True, True, packed)
    gemv = [_call(ext.lowbit_linear, args, (0, None, 1e-6)) for ext in (before, after)]  # SiLU, no post norm
    assert torch.equal(*outs) and torch.equal(*gemv), "the two builds' kernels differ in their bits"
    print("same bits: decode_attention (3 sequences, context 5-300) and the int4 x4 GEMV")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="git revision of the 'before' kernels")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--no-bit-check", action="store_true", help="for changes meant to change results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu_ext._put_ninja_on_path()
    after = cpu_ext.load()
    assert after is not None, "the CPU kernels do not build or run here"
    before = build_revision(args.before, Path(tempfile.mkdtemp(prefix="cpu-ext-ab-")))
    if not args.no_bit_check:
        check_same_bits(before, after)
    config = EngineConfig(
        model="smollm2", device="cpu", dtype="float32", weight_quant="int4", max_model_len=8192,
        cache=CacheConfig(kv_cache_memory_mb=1024),
    )  # fmt: skip
    engine = build_engine(config, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    engine.add_request(engine.make_request(uuid.uuid4().hex, make_prompt(args.prompt_len, 49152, 7), params))
    variants = {f"{args.before} (before)": before, "working tree (after)": after}
    step_ms: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, ext in variants.items():
            cpu_ext.load = lambda ext=ext: ext  # what the bound kernels and lowbit_cpu's calls take
            engine.runner.model.select_kernels()  # rebinds the decode kernels to this extension
            engine.step()  # not timed
            begin = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            step_ms[name].append((time.perf_counter() - begin) * 1e3 / args.steps)
    context = args.prompt_len + args.repeats * len(variants) * (args.steps + 1)
    print(f"SmolLM2 fp32 --weight-quant int4, {args.threads} thread(s), one stream, context "
          f"{args.prompt_len}-{context} tokens; ms per decode step, medians (min) over {args.repeats} rounds:")  # fmt: skip
    for name, values in step_ms.items():
        values.sort()
        print(f"  {name:32s} {values[len(values) // 2]:6.2f} ({values[0]:5.2f})")


if __name__ == "__main__":
    main()
