"""llama.cpp's `llama-perplexity` on the same GGUF and text, beside `kvserve bench quality`.

The binary is built by `make llama-perplexity` from the llama.cpp tree vendored in the same
llama-cpp-python sdist as `llama-server`, and linked into the venv's `bin/`. One run gives its
perplexity (its own tokenization, its default arithmetic: the file's quantized weights, f16 KV) and,
through `--kl-divergence-base FILE`, its log-probabilities of every scored position, which
`read_logits_file` decodes so that its KL against kvserve's fp32 reference is computed by the same
code as kvserve's rows (where both tokenize the text alike).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

VENV_LLAMA_PERPLEXITY = Path(sys.prefix) / "bin" / "llama-perplexity"
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def find_llama_perplexity() -> Path | None:
    """The venv's binary (`make llama-perplexity`), else one on $PATH, else None."""
    if VENV_LLAMA_PERPLEXITY.is_file():
        return VENV_LLAMA_PERPLEXITY
    found = shutil.which("llama-perplexity")
    return Path(found) if found else None


class LogitsFile(NamedTuple):
    """What llama-perplexity's `--kl-divergence-base` file holds."""

    ctx: int
    token_ids: np.ndarray  # [num_chunks * ctx] int32: its tokenization of the text's first chunks
    logprobs: np.ndarray  # [num_chunks * (ctx - 1 - ctx // 2), vocab] float32


def read_logits_file(path: Path) -> LogitsFile:
    """Decode the file: "_logits_", n_ctx, n_vocab, n_chunk (int32), the tokens (int32), then per
    scored position a row of uint16: two floats (scale, min log-prob) and the quantized log-probs,
    padded to an even count (tools/perplexity/perplexity.cpp, `log_softmax`)."""
    raw = path.read_bytes()
    if raw[:8] != b"_logits_":
        raise ValueError(f"{path} is not a llama-perplexity logits file")
    ctx, vocab, num_chunks = np.frombuffer(raw, dtype=np.int32, count=3, offset=8)
    offset = 20
    tokens = np.frombuffer(raw, dtype=np.int32, count=num_chunks * ctx, offset=offset)
    offset += tokens.nbytes
    row_width = 2 * ((vocab + 1) // 2) + 4
    num_rows = num_chunks * (ctx - 1 - ctx // 2)
    rows = np.frombuffer(raw, dtype=np.uint16, count=num_rows * row_width, offset=offset).reshape(
        num_rows, row_width
    )
    scale_min = rows[:, :4].copy().view(np.float32)  # [num_rows, 2]
    logprobs = rows[:, 4 : 4 + vocab].astype(np.float32) * scale_min[:, :1] + scale_min[:, 1:]
    return LogitsFile(int(ctx), tokens, logprobs)


class LlamaRun(NamedTuple):
    perplexity: float
    perplexity_stderr: float
    logits: LogitsFile
    seconds: float


def run_llama_perplexity(
    binary: Path, gguf: Path, text: Path, *, ctx: int, threads: int, max_chunks: int, workdir: Path
) -> LlamaRun:
    """One llama-perplexity run; RuntimeError (with its output's tail) when it fails."""
    logits_path = workdir / "llama-perplexity.kld"
    cmd = [str(binary), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-t", str(threads)]
    cmd += ["--kl-divergence-base", str(logits_path)]
    if max_chunks > 0:
        cmd += ["--chunks", str(max_chunks)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    output = done.stdout + done.stderr
    found = _FINAL.search(output)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{output[-2000:]}")
    elapsed = time.perf_counter() - start
    return LlamaRun(float(found[1]), float(found[2]), read_logits_file(logits_path), elapsed)
