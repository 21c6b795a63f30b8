"""DRY, llama.cpp's anti-loop sampler (engine/dry.py), over the answer so far."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.engine.dry import breaker_mask, dry_penalties
from kvserve.engine.sampler import Penalties
from kvserve.engine.sampling_params import SamplingParams

NO_BREAKERS = np.zeros(100, dtype=bool)


def test_the_token_that_would_extend_a_repeat_is_penalized_exponentially() -> None:
    # 1 2 3 4 ... 1 2 3: a repeat of length 3; sampling 4 would make it 4 long.
    found = dry_penalties([1, 2, 3, 4, 9, 1, 2, 3], NO_BREAKERS, 0.8, 1.75, 2)
    assert found == {4: pytest.approx(0.8 * 1.75 ** (3 - 2))}
    # Shorter than allowed_length: nothing.
    assert dry_penalties([1, 2, 9, 8, 2], NO_BREAKERS, 0.8, 1.75, 2) == {}
    assert dry_penalties([1, 2, 9, 8, 2], NO_BREAKERS, 0.8, 1.75, 1) == {9: pytest.approx(0.8)}


def test_the_longest_match_per_token_wins_and_each_occurrence_counts() -> None:
    # "5 6 7" follows "1 2" once after a 2-long match and "1 2" again after a 3-long one ("0 1 2").
    history = [1, 2, 5, 0, 1, 2, 7, 0, 1, 2]
    found = dry_penalties(history, NO_BREAKERS, 1.0, 2.0, 2)
    assert found == {5: pytest.approx(1.0), 7: pytest.approx(2.0)}


def test_a_loop_is_penalized_more_the_longer_it_runs() -> None:
    paragraph = list(range(10, 40))  # a 30-token "paragraph"
    once = dry_penalties(paragraph + paragraph[:5], NO_BREAKERS, 0.8, 1.75, 2)
    twice = dry_penalties(paragraph * 2 + paragraph[:25], NO_BREAKERS, 0.8, 1.75, 2)
    assert once == {15: pytest.approx(0.8 * 1.75**3)}
    assert twice[35] > 1000 * once[15]  # the match now spans a whole paragraph and more


def test_matches_stop_at_sequence_breakers() -> None:
    breakers = breaker_mask(["a", "b", "\n", "x:", "c", "d", '"', "*"])
    assert breakers.tolist() == [False, False, True, True, False, False, True, True]
    history = [0, 1, 2, 0, 1, 4, 2, 0, 1]  # "a b \n" repeated: the match stops at the newline
    assert dry_penalties(history, breakers, 1.0, 2.0, 2) == {2: pytest.approx(1.0), 4: pytest.approx(1.0)}
    assert dry_penalties([0, 1, 2, 0, 1, 2], breakers, 1.0, 2.0, 1) == {}  # the last token is a breaker


def test_off_and_trivial_histories() -> None:
    assert dry_penalties([1, 2, 1, 2], NO_BREAKERS, 0.0, 1.75, 2) == {}
    assert dry_penalties([], NO_BREAKERS, 0.8, 1.75, 2) == dry_penalties([3], NO_BREAKERS, 0.8, 1.75, 2) == {}
    long = [7] * 500  # a run of one token: matches are capped, the penalty stays finite
    (value,) = dry_penalties(long, NO_BREAKERS, 0.8, 1.75, 2).values()
    assert np.isfinite(value)


def test_sampler_applies_dry_to_its_rows_only_and_never_to_the_prompt() -> None:
    params = [SamplingParams(dry_multiplier=1.0, dry_base=2.0), SamplingParams(repetition_penalty=1.0)]
    assert params[0].has_penalties and not params[1].has_penalties
    prompts = [[1, 2, 3, 1, 2], [1, 2, 3, 1, 2]]  # the prompt repeats, the answer does not
    outputs = [[5, 6, 7, 5, 6], [5, 6, 7, 5, 6]]
    logits = torch.zeros(2, 10)
    processed = Penalties.build(params, prompts, outputs, 10, torch.device("cpu")).apply(logits)
    expected = torch.zeros(10)
    expected[7] = -1.0  # 5 6 -> 7 would repeat "5 6 7"; the prompt's "1 2 -> 3" is not counted
    assert torch.equal(processed[0], expected)
    assert torch.equal(processed[1], logits[1])


def test_bad_dry_parameters_are_rejected() -> None:
    from kvserve.engine.sampling_params import SamplingParamsError

    for fields in ({"dry_multiplier": -1}, {"dry_base": 0.5}, {"dry_allowed_length": 0}):
        with pytest.raises(SamplingParamsError):
            SamplingParams(**fields)
