"""A long prompt's prefill through the whole CPU engine, before and after issue 32's attention change,
on a random-weight model of SmolLM2-135M's shapes (no model download needed; the weights do not
change the arithmetic's cost): `--dtype float32 --weight-quant int4 --bf16-prefill`, what
`--dtype auto` picks for a Q4 GGUF on a CPU with AVX512-BF16 or AMX.

- `before`: prompt attention in fp32 with KV heads repeated per query head (the code before);
- `sdpa`: grouped heads folded into the queries, torch's SDPA under an explicit mask (bf16 with
  `--bf16-prefill`), the code from issue 32 until csrc/prefill_attention.cpp;
- `after`: the code now (the C++ prompt attention where attention/cpu_prefill.py takes it).

`--dtype float32` measures what an AVX2-only CPU runs (fp32 prompt rows, no --bf16-prefill).

Both engines are built in this process and prefill the same random prompt in turn, `--repeats` times.

    python3 scripts/cpu_prefill_engine_ab.py --tokens 12500 --threads 2 --tokenizer DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.attention import torch_ref
from kvserve.models.loader import load_model

SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 16384,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=12500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help="a folder of tokenizer files (the engine loads one; "
        "e.g. AutoTokenizer.from_pretrained(dir, gguf_file=SmolLM2's GGUF).save_pretrained(folder))",
    )
    parser.add_argument("--configs", default="before,after")
    parser.add_argument(
        "--chunk-sizes",
        default="2048",
        help="prompt tokens per engine step (--max-num-batched-tokens), comma-separated: every config "
        "runs at each (named CONFIG@N when more than one); the CPU default for a lone prompt is 2048",
    )
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="prompt rows' dtype"
    )
    parser.add_argument("--profile", action="store_true", help="the last round under torch.profiler: top ops")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="smollm2-shaped-"))
    _random_model(folder, args.layers)
    for item in args.tokenizer.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(item, folder / item.name)
    chunk_sizes = [int(n) for n in args.chunk_sizes.split(",")]
    engines = {
        (f"{name}@{chunk}" if len(chunk_sizes) > 1 else name): _engine(
            folder, args.tokens, args.dtype == "bfloat16", chunk
        )
        for name in args.configs.split(",")
        for chunk in chunk_sizes
    }
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(args.repeats):
        # A fresh prompt per repeat (the same for both engines): a repeat must not hit the prefix cache.
        generator = torch.Generator().manual_seed(repeat)
        prompt = torch.randint(0, SMOLLM2["vocab_size"], (args.tokens,), generator=generator)
        for name, engine in engines.items():
            with _attention(name.split("@")[0]):
                request = engine.make_request(
                    f"{name}-{repeat}", prompt.tolist(), SamplingParams(temperature=0.0, max_tokens=1)
                )
                profiling = args.profile and repeat == args.repeats - 1
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                started = time.perf_counter()
                with profiler if profiling else contextlib.nullcontext():
                    engine.generate([request])
                seconds[name].append(time.perf_counter() - started)
                if profiling:
                    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
            print(
                f"{name}: {seconds[name][-1]:.2f} s ({args.tokens / seconds[name][-1]:.1f} tok/s)", flush=True
            )
    best = {name: min(values) for name, values in seconds.items()}
    if "after" in best or len(chunk_sizes) > 1:
        base = "after" if "after" in best else next(iter(best))
        print(
            f"{args.tokens} tokens, {args.threads} threads, best of {args.repeats}: "
            + ", ".join(
                f"{name} {value:.2f} s ({value / best[base]:.2f}x {base})" for name, value in best.items()
            )
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": seconds}, indent=1)
            + "\n"
        )


def _random_model(folder: Path, layers: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**(SMOLLM2 | {"num_hidden_layers": layers})))
    model.save_pretrained(folder, safe_serialization=True)


def _engine(folder: Path, tokens: int, bf16_prefill: bool, chunk: int = 512) -> EngineCore:
    config = EngineConfig(
        model=str(folder),
        dtype="float32",
        device="cpu",
        weight_quant="int4",
        bf16_prefill=bf16_prefill,
        max_model_len=tokens + 64,
        scheduler=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=chunk),
    )
    loaded = load_model(str(folder), torch.float32, progress=False, context=config.context_request)
    return EngineCore(config, loaded)


class _attention:
    """`before`: the module's prompt attention swapped for the code before issue 32 while it runs;
    `before` and `sdpa`: the C++ prompt attention off."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.saved = torch_ref._attend_prefill, torch_ref.TorchRefBackend._prefill_kernel
        if self.name == "before":
            torch_ref._attend_prefill = _attend_prefill_before
        if self.name in ("before", "sdpa"):
            torch_ref.TorchRefBackend._prefill_kernel = lambda self, dtype, cache: None

    def __exit__(self, *exc: object) -> None:
        torch_ref._attend_prefill, torch_ref.TorchRefBackend._prefill_kernel = self.saved


def _attend_prefill_before(q, k, v, cache, plan, scale, dtype, mask):
    """torch_ref._attend_prefill at 39be48f: fp32, KV heads repeated per query head."""
    q_seq = q[plan.query_start : plan.query_end].transpose(0, 1)
    if plan.block_ids is None:
        k_seq = torch_ref.as_stored(k[plan.query_start : plan.query_end], cache.dtype).transpose(0, 1)
        v_seq = torch_ref.as_stored(v[plan.query_start : plan.query_end], cache.dtype).transpose(0, 1)
    else:
        kv = cache.index_select(1, plan.block_ids).flatten(1, 2)[:, : plan.num_keys]
        kv = kv.transpose(1, 2).to(q.dtype)
        k_seq, v_seq = kv[0], kv[1]
    group = q_seq.shape[0] // k_seq.shape[0]
    if group > 1:
        k_seq, v_seq = k_seq.repeat_interleave(group, dim=0), v_seq.repeat_interleave(group, dim=0)
    is_causal = plan.mask is None and plan.block_ids is None
    out = F.scaled_dot_product_attention(
        q_seq[None], k_seq[None], v_seq[None], attn_mask=plan.mask, is_causal=is_causal, scale=scale
    )[0]
    return out.transpose(0, 1)


if __name__ == "__main__":
    main()
