"""SamplingParams validates every field once, with a message the API can show."""

from __future__ import annotations

import pytest

from kvserve.engine.sampling_params import SamplingParams, SamplingParamsError


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_k": -2},
        {"min_p": 1.5},
        {"presence_penalty": 3.0},
        {"repetition_penalty": 0.0},
        {"repetition_last_n": -1},
        {"length_decay_factor": 0.5},
        {"dry_base": 0.9},
        {"max_tokens": 0},
        {"logprobs": 21},
        {"logit_bias": ((5, float("inf")),)},
        {"logit_bias": ((-1, 1.0),)},
        {"seed": 2**64},
    ],
)
def test_out_of_range_fields_are_rejected(fields: dict) -> None:
    with pytest.raises(SamplingParamsError):
        SamplingParams(**fields)


def test_defaults_and_greedy() -> None:
    assert not SamplingParams().is_greedy
    assert SamplingParams(temperature=0).is_greedy and SamplingParams(top_k=1).is_greedy
    assert SamplingParams(seed=2**64 - 1, logit_bias=((3, -100.0),)).seed == 2**64 - 1
