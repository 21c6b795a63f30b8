"""compile_watch: Triton compiles after the warm-up are named in the log and never skipped."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from kvserve.engine.compile_watch import CompileWatch, watch_compiles


def test_a_compile_is_logged_with_its_kernel_and_time(caplog: pytest.LogCaptureFixture) -> None:
    watch = CompileWatch()
    fn = SimpleNamespace(module="kvserve.models.layers.attention.triton_prefill", name="_prefill_kernel")
    with caplog.at_level(logging.WARNING, logger="kvserve.engine.compile_watch"):
        # Triton calls the first hook before compiling: a true answer would skip the compile.
        assert watch.before(key=("k",), repr="r", fn=fn, compile={}, is_manual_warmup=False) is None
        watch.after(key=("k",), repr="_prefill_kernel[num_warps=4](stride_bt: i32)", fn=fn, compile={})
    assert [name for name, _ in watch.compiles] == [
        "kvserve.models.layers.attention.triton_prefill._prefill_kernel"
    ]
    assert watch.compiles[0][1] >= 0
    assert "stride_bt: i32" in caplog.text and "_prefill_kernel" in caplog.text


def test_installs_into_tritons_hooks() -> None:
    knobs = pytest.importorskip("triton.knobs")
    saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    try:
        watch = watch_compiles()
        assert watch is not None
        assert knobs.runtime.jit_cache_hook == watch.before
        assert knobs.runtime.jit_post_compile_hook == watch.after
    finally:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved
