"""Start-up warm-up on CUDA: run a few throwaway batches so Triton compiles the kernel variants a
server's first real batches need before the first client waits for them.

Triton compiles a kernel per specialization of its arguments (integers equal to 1 or divisible by 16
among them), so the first multi-sequence prefill, the first chunked one and the first step that
mixes prefills with decodes each paid a compile inside a request (the H200 run of issue 21: p99 TTFT
2.5 s at 16 streams, `_do_compile` in the engine thread). The batches below cover those shapes; the
disk tier is detached while they run and their blocks leave the prefix cache afterwards, so nothing
of them is saved, reused or counted as a hit.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from kvserve.engine.compile_watch import watch_compiles
from kvserve.engine.kv_tier import NullKVTier
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.attention.backend import PrecompilesKernels

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore

logger = logging.getLogger(__name__)

# Waves of prompt lengths: one short prompt alone, then a batch of mixed lengths (unaligned and
# 16-aligned), then a second batch added while the first decodes (prefill + decode in one step).
WAVES = ((17,), (512, 300, 64, 1031), (512, 512, 33))


def compile_attention_variants(core: EngineCore) -> None:
    """The backend's kernel variants (the Triton decode kernel at every split count), once per
    distinct attention layer: an eager step (one that mixes prompts with decodes) picks its split
    count from its batch size and longest sequence, so the batches above reach only a few of them
    (on an H200, three compiles of 290-560 ms fell in the first 16-, 64- and 256-stream bursts)."""
    model = getattr(core.runner, "model", None)  # a tensor-parallel driver: its ranks warm themselves
    if model is None:
        return
    done = set()
    for layer in model.model.layers:
        attn = layer.self_attn
        backend, cache = attn.backend, attn.kv_cache
        key = (attn.num_heads, attn.scale, attn.sliding_window, None if cache is None else tuple(cache.shape))
        if not isinstance(backend, PrecompilesKernels) or cache is None or key in done:
            continue
        done.add(key)
        backend.precompile(cache, attn.num_heads, scale=attn.scale, window=attn.sliding_window)


def warm_up(core: EngineCore, force: bool = False) -> None:
    """On CUDA (or with `force`): run WAVES through the engine; a no-op elsewhere."""
    if not (force or str(core.config.device).startswith("cuda")):
        return
    started = time.monotonic()
    vocab = core.loaded.arch.vocab_size
    limit = core.max_model_len - 8
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    tier, core.kv_tier = core.kv_tier, NullKVTier()  # the random warm-up prompts: neither loaded nor saved
    try:
        for wave, lengths in enumerate(WAVES):
            for i, length in enumerate(lengths):
                ids = [rng.randrange(vocab) for _ in range(max(1, min(length, limit)))]
                core.add_request(core.make_request(f"kvserve-warmup-{wave}-{i}", ids, params))
            core.step()  # the next wave joins while this one decodes
        while core.has_unfinished_requests():
            core.step()
    finally:
        core.kv_tier = tier
        core.kv_manager.pool.reset_prefix_cache()
        core.kv_manager.stats = type(core.kv_manager.stats)()  # the hit rate counts clients only
    compile_attention_variants(core)
    logger.info("warm-up: %d batches in %.1f s", len(WAVES), time.monotonic() - started)
    # From here on a compile is one a request waits for: name each (compile_watch.py).
    watch_compiles()
