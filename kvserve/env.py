"""The `KVSERVE_*` environment switches: debug and A/B toggles for measurements, not configuration
(what a user chooses is a `kvserve` flag).

Each is parsed here, once, with its type and default, so a mistyped value stops the process with an
error that names the variable instead of quietly meaning something else. Imports nothing from the
project: every layer (models, engine, cli) reads its switch from here.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvSwitchError(ValueError):
    """A `KVSERVE_*` variable holds a value its switch cannot take."""


@dataclass(frozen=True, slots=True)
class EnvSwitches:
    # KVSERVE_FUSED_OPS: the Triton kernels for a decoder layer's small ops (models/layers/fused_ops.py).
    is_fused_ops_enabled: bool
    # KVSERVE_CPU_KERNELS: the AVX2 C++ decode kernels (models/layers/cpu_ext.py).
    is_cpu_kernels_enabled: bool
    # KVSERVE_CPU_PREFILL_ATTENTION: the C++ attention for prompt rows (models/layers/attention/cpu_prefill.py).
    is_cpu_prefill_attention_enabled: bool
    # KVSERVE_PDL: programmatic dependent launch of the Triton kernels (models/layers/triton_launch.py).
    is_pdl_enabled: bool
    # KVSERVE_GEMV_HEAD: the one-token LM head as a GEMV with its argmax fused (models/layers/gemv.py).
    is_gemv_head_enabled: bool
    # KVSERVE_GEMV_FULL_K_MB: GEMV weights up to this size load whole before the PDL wait.
    gemv_full_k_max_mb: float
    # KVSERVE_SWITCH_INTERVAL_MS: the GIL's switch interval in `kvserve serve`; 0 keeps Python's 5 ms,
    # which beat 1 ms on the H200 at 256 streams (scripts/serve_e2e_bench.py).
    switch_interval_ms: float
    # KVSERVE_KV_WRITE_DELAY_MS: a pause at each step of a disk-tier checkpoint write or delete
    # (after each chunk file, before the manifest, between a manifest's and its chunks' removal), so
    # the crash harness's kill -9 lands inside those windows more often (scripts/crash_harness.py).
    kv_write_delay_ms: float
    # KVSERVE_DENSE_PACK: prompt GEMMs on bf16 weights packed once for oneDNN (models/layers/quant.py).
    is_dense_pack_enabled: bool


def read_switches(environ: Mapping[str, str]) -> EnvSwitches:
    """Every switch from `environ`; an unset or empty variable gives the switch's default.
    Raises EnvSwitchError on a value the switch cannot take."""
    return EnvSwitches(
        is_fused_ops_enabled=_flag(environ, "KVSERVE_FUSED_OPS", default=True),
        is_cpu_kernels_enabled=_flag(environ, "KVSERVE_CPU_KERNELS", default=True),
        is_cpu_prefill_attention_enabled=_flag(environ, "KVSERVE_CPU_PREFILL_ATTENTION", default=True),
        is_pdl_enabled=_flag(environ, "KVSERVE_PDL", default=True),
        is_gemv_head_enabled=_flag(environ, "KVSERVE_GEMV_HEAD", default=True),
        gemv_full_k_max_mb=_amount(environ, "KVSERVE_GEMV_FULL_K_MB", default=16.0),
        switch_interval_ms=_amount(environ, "KVSERVE_SWITCH_INTERVAL_MS", default=0.0),
        kv_write_delay_ms=_amount(environ, "KVSERVE_KV_WRITE_DELAY_MS", default=0.0),
        is_dense_pack_enabled=_flag(environ, "KVSERVE_DENSE_PACK", default=True),
    )


@functools.cache
def switches() -> EnvSwitches:
    """This process's switches, read from its environment at the first call."""
    return read_switches(os.environ)


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    value = environ.get(name, "").strip()
    if not value:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise EnvSwitchError(f"{name}={value!r}: expected 1 or 0 (or true/false, yes/no, on/off)")


def _amount(environ: Mapping[str, str], name: str, default: float) -> float:
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        amount = float(value)
    except ValueError:
        amount = math.nan
    if not (math.isfinite(amount) and amount >= 0):
        raise EnvSwitchError(f"{name}={value!r}: expected a number >= 0")
    return amount
