"""`--weight-quant` (the CLI's default for a quantized GGUF): a request's tokens do not depend on the
other requests that share its steps.

Two things made them depend: the low-bit kernels summed a row's groups in another order when
several rows shared a call (one FMA chain per row instead of single-row decode's four), and a decode
row that shared a step with another request's prompt ran on the dense weights, as every row of such
a step did. SmolLM2 int4 answered 3 of 8 chat questions differently when other requests' prompts
arrived while it decoded (4 of 8 with the kernels fixed but the rows not split)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers import cpu_ext, lowbit_cpu
from tests.engine.conftest import VOCAB, make_engine

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="no AVX2 CPU kernels here")


@pytest.mark.parametrize(
    ("bits", "quantize_x", "gated"),
    [(4, True, False), (4, True, True), (8, True, False), (8, False, False)],  # last: the LM head's mode
)
@pytest.mark.parametrize("packed", [False, True])
def test_a_row_of_a_multi_row_call_is_the_single_row_call_bit_for_bit(
    bits: int, quantize_x: bool, gated: bool, packed: bool
) -> None:
    torch.manual_seed(bits + 2 * gated)
    weight = torch.randn(256, 576) * 0.02
    qweight, scales = lowbit_cpu.quantize(weight, bits)
    layout = lowbit_cpu.pack_for_decode(qweight, scales, bits) if packed else None
    x = torch.randn(16, 576)

    def linear(rows: torch.Tensor) -> torch.Tensor:
        return lowbit_cpu.lowbit_linear(
            rows, qweight, scales, bits, None, gated=gated, quantize_x=quantize_x, packed=layout
        )

    single = torch.cat([linear(x[i : i + 1]) for i in range(16)])
    for num_rows in (2, 3, 4, 5, 8, 16):
        assert torch.equal(linear(x[:num_rows]), single[:num_rows]), num_rows


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _decode_with_arrivals(engine, prompt: list[int], arrive_every: int, rng: random.Random) -> list[int]:
    """Request "a"'s tokens; with `arrive_every`, a new request's prompt every that many steps."""
    engine.add_request(engine.make_request("a", prompt, GREEDY))
    tokens: list[int] = []
    steps = arrivals = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == "a":
                tokens.extend(output.new_token_ids)
        steps += 1
        if arrive_every and steps % arrive_every == 0 and len(tokens) < 20:
            arrivals += 1
            other = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 40))]
            engine.add_request(engine.make_request(f"b{arrivals}", other, SamplingParams(max_tokens=3)))
    return tokens


@pytest.mark.parametrize("scheme", ["int4", "int8", "none"])
def test_a_decode_does_not_depend_on_prompts_arriving_beside_it(tiny_llama_dir: Path, scheme: str) -> None:
    """Fresh engines each time (no prefix cache shared between the runs). A random tiny model's
    logits are nearly flat, so any change in a decode row's arithmetic moves its greedy tokens.
    "none": the dense engine's rows (quant.DenseRowsLinear), split from the prompt rows the same way."""
    rng = random.Random(0)
    for trial in range(4):
        prompt = [rng.randrange(VOCAB) for _ in range(20 + 7 * trial)]
        alone = _decode_with_arrivals(make_engine(tiny_llama_dir, weight_quant=scheme), prompt, 0, rng)
        beside = _decode_with_arrivals(make_engine(tiny_llama_dir, weight_quant=scheme), prompt, 3, rng)
        assert beside == alone, trial
