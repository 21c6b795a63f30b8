"""What `kvserve bench quality` measures: the reference configuration, one row per fast path (each a
change to the reference that isolates that path), the modes and the default text. Plain config, no
numpy or torch, so that the CLI's parser can read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvserve.config import CacheConfig, EngineConfig, WeightQuantName

# How a chunk's tokens reach the model (logit_scorer.py): all as one prompt, the scored ones as
# one-token decode steps, or all of them as decode steps (the context's KV written by decode).
ScoreMode = Literal["prompt", "decode", "reuse"]
SCORE_MODES: tuple[ScoreMode, ...] = ("prompt", "decode", "reuse")

DEFAULT_TEXT = Path(__file__).with_name("data") / "alice.txt"


@dataclass(frozen=True)
class Row:
    """One configuration to measure: a change to the reference's, isolating one path."""

    name: str
    what: str  # what it exercises, for the table
    weight_quant: WeightQuantName = "none"
    kv_dtype: str = "float32"
    bf16_prefill: bool = False
    int8_prefill: bool = False
    context_factor: int = 0  # > 0: --ctx at this many times the model's own context (YaRN)
    static_rope: bool = False  # with context_factor: --rope-scaling yarn, every request scaled

    def config(self, reference: EngineConfig, model_context: int) -> EngineConfig:
        return dataclasses.replace(
            reference,
            weight_quant=self.weight_quant,
            bf16_prefill=self.bf16_prefill,
            int8_prefill=self.int8_prefill,
            max_model_len=model_context * self.context_factor if self.context_factor else 0,
            rope_scaling="yarn" if self.static_rope else None,
            cache=dataclasses.replace(reference.cache, kv_dtype=self.kv_dtype),  # type: ignore[arg-type]
        )


ROWS = {
    row.name: row
    for row in (
        Row("int4", "int4 weights, int8-rounded activations (decode-sized batches)", weight_quant="int4"),
        Row("int8", "int8 weights (decode-sized batches)", weight_quant="int8"),
        Row("fp16-kv", "float16 KV pool", kv_dtype="float16"),
        # The file's own low-bit pick (int4 on Q4 files, int8 on Q4_K_M's mixed bits), as `dtype auto`
        # pairs it with bf16 prefill on a CPU with fast bf16: the default there for every model.
        Row(
            "bf16-prefill",
            "the file's low-bit decode (--weight-quant auto) + bf16 dense weights and attention for prompts",
            "auto",
            bf16_prefill=True,
        ),
        Row("int8-prefill", "int4 decode + int4 x int8 GEMM for prompts", "int4", int8_prefill=True),
        Row(
            "yarn-x2",
            "--ctx at 2x the model's context (make serve's 16K for SmolLM2): YaRN on demand, so a chunk "
            "that fits the trained context runs as trained",
            context_factor=2,
        ),
        Row("yarn-x4", "--ctx at 4x the model's context (32K for SmolLM2): YaRN on demand", context_factor=4),
        Row(
            "yarn-x2-static",
            "--ctx 2x with --rope-scaling yarn: every request scaled (llama.cpp's and vLLM's YaRN)",
            context_factor=2,
            static_rope=True,
        ),
        Row(
            "yarn-x4-static",
            "--ctx 4x with --rope-scaling yarn: every request scaled",
            context_factor=4,
            static_rope=True,
        ),
    )
}
CONFIG_ROW = "config"  # the engine flags given: kvserve's defaults when none are


def reference_config(flags: EngineConfig) -> EngineConfig:
    """Dense fp32 weights, fp32 KV, the model's own context; the flags' model, device and budget."""
    return dataclasses.replace(
        flags,
        dtype="float32",
        weight_quant="none",
        bf16_prefill=False,
        int8_prefill=False,
        max_model_len=0,
        rope_scaling=None,
        rope_scale=0.0,
        cache=CacheConfig(block_size=flags.cache.block_size, kv_dtype="float32"),
        kv_store=None,
    )
