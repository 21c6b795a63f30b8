"""End to end: a random-weight HF folder, `kvserve serve`, `bench serve` per concurrency, `bench engine`.

What a new user gets through HTTP, against what the engine alone does with the same folder in the same
run (issue 21). `--shape llama-3.2-1b --device cuda` is the GPU stage of scripts/gpu_session.sh;
`--shape tiny --device cpu` is its rehearsal and the host-overhead harness: a tiny model costs the
engine little, so the serving path's per-token host cost is most of what is measured, and `--profile C`
records the server with py-spy (all threads, raw collapsed stacks) while concurrency C runs.

    python scripts/serve_e2e_bench.py --tokenizer TOKDIR --out OUT [--shape tiny --device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

SHAPES = {
    "llama-3.2-1b": None,  # kvserve.bench.shapes' Llama-3.2-1B, with the tokenizer's vocabulary
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_model(shape: str, tokenizer_dir: Path, out: Path, device: str) -> Path:
    """Random weights (transformers' init, seed 0), bf16 safetensors, the tokenizer files beside them."""
    import torch
    import transformers

    from kvserve.bench.shapes import SHAPES as ENGINE_SHAPES

    if (out / "config.json").exists():
        return out
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    spec = SHAPES[shape] or {k: v for k, v in ENGINE_SHAPES[shape].items() if k != "model_type"}
    config = transformers.LlamaConfig(
        **{**spec, "vocab_size": len(tokenizer)},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    print(
        f"model: {shape} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params) -> {out}",
        flush=True,
    )
    return out


def start_server(model: Path, args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "kvserve", "serve", "--model", str(model), "--device", args.device]
    command += ["--no-kv-cache", "--port", str(args.port), "--ctx", str(args.ctx), *args.serve_args.split()]
    print("server:", " ".join(command[1:]), flush=True)
    env = {**os.environ, "PYTHONPATH": args.server_path} if args.server_path else None
    server = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"server exited with {server.returncode}; log: {log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
            return server
        except OSError:
            time.sleep(1)
    server.kill()
    sys.exit(f"server did not come up in {args.start_timeout} s; log: {log.read_text()[-3000:]}")


def bench_serve(
    model: Path, concurrency: int, args: argparse.Namespace, warmup: bool = False
) -> dict[str, float]:
    name = f"serve-c{concurrency}" + ("-warmup" if warmup else "")
    num_prompts = concurrency if warmup else max(concurrency * args.waves, args.min_prompts)
    command = [sys.executable, "-m", "kvserve", "bench", "serve", "--url", f"http://127.0.0.1:{args.port}"]
    command += ["--model", str(model), "--dataset", "random", "--input-len", str(args.input_len)]
    command += ["--output-len", str(args.output_len), "--num-prompts", str(num_prompts)]
    command += [
        "--max-concurrency",
        str(concurrency),
        "--client-procs",
        str(min(args.client_procs, concurrency)),
    ]
    command += ["--out", str(args.out), "--name", name, "--no-progress"]
    if not args.logit_bias_eos:  # plain greedy requests, as `bench engine` runs them (overlapped decode)
        command.append("--ignore-eos")
    print("bench:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    summary = json.loads((args.out / f"{name}.json").read_text())["summary"]
    return next(iter(summary.values()))


def profile(pid: int, concurrency: int, args: argparse.Namespace) -> threading.Thread | None:
    """py-spy over the server (and its engine process) once half of `concurrency` streams are in
    flight (the client's setup takes seconds), GIL holders only (`--gil`): what the engine and the
    event loop each take."""
    if shutil.which("py-spy") is None:
        print("py-spy not found: no profile", flush=True)
        return None
    path = args.out / f"pyspy-c{concurrency}.txt"
    command = [
        "py-spy",
        "record",
        "--pid",
        str(pid),
        "--threads",
        "--gil",
        "--subprocesses",  # the engine process too (--engine-process)
        "--nonblocking",
        "--format",
        "raw",
    ]
    command += ["--rate", "250", "--duration", str(args.profile_s), "--output", str(path)]

    def record() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _in_flight(args.port) < concurrency // 2:
            time.sleep(0.3)
        subprocess.run(command, check=False)

    thread = threading.Thread(target=record)
    thread.start()
    return thread


def _in_flight(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("kvserve_generations_in_flight "):
                return float(line.split()[1])
    return 0.0


def bench_engine(model: Path, args: argparse.Namespace) -> dict[int, float]:
    path = args.out / "engine.json"
    command = [
        sys.executable,
        "-m",
        "kvserve",
        "bench",
        "engine",
        "--model",
        str(model),
        "--device",
        args.device,
    ]
    command += ["--no-peer", "--prefill-lens", str(args.input_len), "--concurrency", args.concurrency]
    command += ["--decode-tokens", str(args.engine_decode_tokens), "--repeats", "1", "--json", str(path)]
    command += ["--ctx", str(args.ctx), "--max-num-seqs", "256", "--max-num-batched-tokens", "8192"]
    print("engine:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return {int(c): v for c, v in json.loads(path.read_text())["kvserve"]["decode_tok_s"].items()}


def bench_workload(model: Path, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """The engine alone on the same workload (scripts/engine_workload_bench.py): prefill included."""
    path = args.out / "engine-workload.json"
    command = [
        sys.executable,
        str(Path(__file__).with_name("engine_workload_bench.py")),
        "--model",
        str(model),
    ]
    command += ["--device", args.device, "--ctx", str(args.ctx), "--concurrency", args.concurrency]
    command += ["--waves", str(args.waves), "--min-prompts", str(args.min_prompts), "--json", str(path)]
    command += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    if args.warmup:
        command.append("--warmup")
    print("engine workload:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return {int(c): v for c, v in json.loads(path.read_text()).items()}


def report(
    served: dict[int, dict[str, float]],
    engine: dict[int, float],
    out: Path,
    workload: dict[int, dict[str, float]] | None = None,
) -> None:
    workload = workload or {}
    lines = [
        (
            "| concurrency | HTTP output tok/s | engine decode tok/s | ratio | engine, same workload tok/s "
            "| ratio | median TTFT ms (engine alone) | median ITL ms |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, row in served.items():
        decode = engine.get(c)
        alone = workload.get(c)
        tok_s = row["output_throughput"]
        ratio = f"{tok_s / decode:.0%}" if decode else "-"
        alone_ratio = f"{tok_s / alone['output_throughput']:.0%}" if alone else "-"
        alone_tok_s = f"{alone['output_throughput']:,.0f}" if alone else "-"
        alone_ttft = f" ({alone['median_ttft_ms']:,.0f})" if alone else ""
        lines.append(
            f"| {c} | {tok_s:,.0f} | {f'{decode:,.0f}' if decode else '-'} | {ratio} | {alone_tok_s} "
            f"| {alone_ratio} | {row['median_ttft_ms']:,.1f}{alone_ttft} | {row['median_itl_ms']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="folder of tokenizer.json + tokenizer_config.json"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/kvserve-random-model"))
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--waves", type=int, default=2, help="prompts per concurrency level = waves x concurrency")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--serve-args", default="", help="extra `kvserve serve` flags")
    p.add_argument(
        "--server-path", default=None, help="PYTHONPATH of the server (an A/B against another tree)"
    )
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument(
        "--profile", type=int, default=None, metavar="C", help="py-spy the server at concurrency C"
    )
    p.add_argument("--profile-s", type=int, default=10)
    p.add_argument("--no-engine", action="store_true", help="skip `bench engine`")
    p.add_argument(
        "--logit-bias-eos",
        action="store_true",
        help="suppress EOS by logit_bias (bench serve's default) rather than `ignore_eos`: greedy with a "
        "bias is not plain greedy, so the engine decodes without overlapping steps",
    )
    p.add_argument("--engine-decode-tokens", type=int, default=128)
    p.add_argument(
        "--warmup",
        action="store_true",
        help="before each timed run, one untimed wave of the same concurrency (server and engine alone): "
        "first-use costs such as kernel compiles for new batch shapes stay out of the figures",
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.shape, args.tokenizer, args.model_dir / args.shape, args.device)
    server = start_server(model, args, args.out / "server.log")
    served: dict[int, dict[str, float]] = {}
    try:
        for c in (int(x) for x in args.concurrency.split(",")):
            if args.warmup:
                bench_serve(model, c, args, warmup=True)
            spy = profile(server.pid, c, args) if args.profile == c else None
            served[c] = bench_serve(model, c, args)
            if spy is not None:
                spy.join()
    finally:
        server.terminate()
        server.wait(60)
    engine = {} if args.no_engine else bench_engine(model, args)
    workload = {} if args.no_engine else bench_workload(model, args)
    report(served, engine, args.out, workload)


if __name__ == "__main__":
    main()
