"""`--weight-quant` on fp32 CPUs: prompt tokens always run on the dense weights, so a prompt gives
the same first token whether it was prefilled whole or partly read from the prefix cache.

The low-bit kernels round activations to int8 and served any batch of up to 16 rows: a prompt
whose first blocks were cached had its short tail prefilled on them, and SmolLM2's greedy answer to
a repeated 37-token chat prompt changed ("The capital of France is Paris." the first time,
"L'Étoile, la Marseillaise, ..." the second)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext
from tests.engine.conftest import VOCAB, make_engine

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="no AVX2 CPU kernels here")

# logprobs=0: the sampled token's logprob, a fine probe of the logits it came from.
FIRST = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=0)


def _first_logprob(engine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    request = engine.make_request(request_id, prompt, FIRST)
    (output,) = engine.generate([request])[request_id]
    return output.new_logprobs[0].logprob, request.num_cached_tokens


@pytest.mark.parametrize("tail", [5, 1])  # 1: a one-token tail, which counts as a decode row by shape
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_a_cached_prefix_gives_the_first_token_of_a_cold_prefill(
    tiny_llama_dir: Path, scheme: str, tail: int
) -> None:
    engine = make_engine(tiny_llama_dir, weight_quant=scheme)
    rng = random.Random(tail)
    prompt = [rng.randrange(VOCAB) for _ in range(32 + tail)]
    cold, cached_cold = _first_logprob(engine, "cold", prompt)
    warm, cached_warm = _first_logprob(engine, "warm", prompt)
    assert (cached_cold, cached_warm) == (0, 32)  # the second prefills only the tail
    # Dense fp32 GEMMs over 37 rows and over 5 differ in rounding only; int8 activations by ~1e-3.
    assert warm == pytest.approx(cold, abs=1e-5)
