"""TritonBackend against the dense oracle and the torch reference backend.

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before the kernels
are imported) over one batch that holds every case; on CUDA they compile and every case and
window runs on its own.
"""

from __future__ import annotations

import os

import pytest
import torch

IS_CUDA = torch.cuda.is_available()
if not IS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kvserve.models.layers.attention.triton_backend import TritonBackend
from tests.models.test_torch_ref import _run

DEVICE = "cuda" if IS_CUDA else "cpu"
# (context_len, num_new) per sequence; leading one-token entries with context are decodes.
CASES = {
    "ragged_decodes": [(29, 1), (6, 1), (17, 1)],
    "long_decode_split_k": [(300, 1), (70, 1)],
    "fresh_prefill": [(0, 23)],
    "chunk_with_cached_prefix": [(13, 10)],
    "two_query_tiles": [(20, 140)],
    # decodes (one split across many blocks), fresh prefill, prefix + chunk, one-token chunk
    "mixed": [(130, 1), (8, 1), (0, 9), (40, 7), (3, 1)],
}
if not IS_CUDA:  # the interpreter is slow: one batch covers the cases
    CASES = {"mixed": CASES["mixed"]}


def _backend() -> TritonBackend:
    # 4 "SMs" on CPU: the two decodes x 2 KV heads get 2 splits, so split-K and its merge run.
    return TritonBackend(num_sms=4 if DEVICE == "cpu" else None)


@pytest.mark.parametrize("window", [None, 5] if not IS_CUDA else [None, 5, 64])
@pytest.mark.parametrize("batch", CASES.values(), ids=CASES.keys())
def test_matches_dense_fp32(batch: list[tuple[int, int]], window: int | None) -> None:
    out, expected = _run(batch, window, torch.float32, DEVICE, backend=_backend())
    tol = 1e-5 if DEVICE == "cpu" else 1e-4
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


def test_matches_reference_bf16() -> None:
    batch = CASES["mixed"]
    out, expected = _run(batch, None, torch.bfloat16, DEVICE, backend=_backend())
    ref, _ = _run(batch, None, torch.bfloat16, DEVICE)
    # The oracle runs in fp32 on the same bf16 inputs; bf16 output rounding is ~4e-3 relative.
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_negative_slot_writes_nothing() -> None:
    cache = torch.randn(2, 4, 4, 2, 16, device=DEVICE)  # 16 slots of [2 heads, 16]
    before = cache.clone()
    k = torch.randn(2, 2, 16, device=DEVICE)
    _backend().write_kv(cache, k, k + 1, torch.tensor([-1, 5], device=DEVICE))
    changed = (cache != before).view(2, 16, -1).any(-1)  # [K/V, slot]
    assert changed.nonzero().tolist() == [[0, 5], [1, 5]]
    torch.testing.assert_close(cache[1].reshape(16, 2, 16)[5], k[1] + 1)


def test_split_variants_cover_every_choice_and_leave_the_cache_alone() -> None:
    """engine/warmup.py compiles the decode kernel at each of SPLIT_CHOICES: every count the eager
    path can pick must be one of them, and the warm-up's launches only read the cache."""
    from kvserve.models.layers.attention.triton_decode import (
        SPLIT_CHOICES,
        choose_num_splits,
        compile_split_variants,
    )

    picked = {
        choose_num_splits(seqs, kv_heads, max_len, sms)
        for seqs in (1, 2, 3, 16, 64, 256)
        for kv_heads in (1, 2, 8)
        for max_len in (None, 1, 100, 513, 8192)
        for sms in (4, 132)
    }
    assert picked <= set(SPLIT_CHOICES) and len(picked) > 1
    cache = torch.randn(2, 3, 16, 2, 64, device=DEVICE)
    before = cache.clone()
    compile_split_variants(cache, 6, scale=0.125, window=None)
    assert torch.equal(cache, before)


def test_kernels_are_not_specialized_on_the_block_table_width() -> None:
    """An eager step's block-table width is its longest sequence's block count; a specialization on
    it (== 1, divisible by 16) was a compile inside a request on the H200."""
    from kvserve.models.layers.attention.triton_decode import _decode_split_kernel
    from kvserve.models.layers.attention.triton_prefill import _prefill_kernel

    for kernel in (_decode_split_kernel, _prefill_kernel):
        # A JITFunction keeps them as argument indices; the interpreter's wrapper, its jit kwargs.
        listed = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]
        names = {kernel.arg_names[i] if isinstance(i, int) else i for i in listed}
        assert {"stride_bt", "window"} <= names
