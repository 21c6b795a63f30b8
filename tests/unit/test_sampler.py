"""Sampler: greedy, filters, seeded reproducibility, penalties, bias and logprobs on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.engine.sampler import Penalties, Sampler, SamplingBatch, make_generator
from kvserve.engine.sampling_params import SamplingParams

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0)


def _batch(params, vocab_size, prompts=None, outputs=None, generators=None) -> SamplingBatch:
    n = len(params)
    return SamplingBatch.build(
        params,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        generators if generators is not None else [None] * n,
        vocab_size,
        CPU,
    )


def _sample(logits, params, **kwargs):
    output = Sampler()(logits, _batch(params, logits.shape[1], **kwargs))
    return output.sampled_token_ids.tolist(), output.logprobs


def _repeat(probs: list[float], n: int) -> torch.Tensor:
    return torch.tensor(probs).log().repeat(n, 1)  # [n, V]


def test_greedy_is_argmax_with_lowest_index_on_ties():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    logits[5, 7] = logits[5, 30] = logits[5].max() + 1  # tie
    ids, logprobs = _sample(logits, [GREEDY] * 6)
    assert ids == logits.argmax(-1).tolist()
    assert ids[5] == 7
    assert logprobs == [None] * 6


def test_all_greedy_batch_builds_no_sampling_state():
    batch = _batch([GREEDY, SamplingParams(top_k=1, seed=3)], 10, generators=[None, make_generator(3, CPU)])
    assert batch.is_all_greedy
    assert batch.temperature is None and batch.top_k is None and batch.top_p is None
    assert batch.penalties is None and batch.bias_index is None and batch.seeded_rows == []


@pytest.mark.parametrize("temperature", [1e-7, 0.02])
def test_near_zero_temperature_is_argmax(temperature):
    torch.manual_seed(0)
    logits = torch.randn(64, 100) * 3
    ids, _ = _sample(logits, [SamplingParams(temperature=temperature)] * 64)
    assert ids == logits.argmax(-1).tolist()


def test_top_k_one_and_tiny_top_p_equal_greedy():
    torch.manual_seed(0)
    logits = torch.randn(64, 100) * 0.1  # nearly flat: plain sampling would scatter
    expected = logits.argmax(-1).tolist()
    assert _sample(logits, [SamplingParams(temperature=2.0, top_k=1)] * 64)[0] == expected
    assert _sample(logits, [SamplingParams(temperature=2.0, top_p=1e-6)] * 64)[0] == expected


def test_top_k_keeps_only_k_best():
    torch.manual_seed(0)
    logits = _repeat([0.1, 0.4, 0.2, 0.3], 2000)
    ids, _ = _sample(logits, [SamplingParams(temperature=1.5, top_k=2)] * 2000)
    assert set(ids) == {1, 3}


def test_top_p_keeps_smallest_nucleus():
    torch.manual_seed(0)
    # Sorted masses 0.5, 0.3, 0.15, 0.05: top_p=0.7 needs the first two.
    logits = _repeat([0.15, 0.5, 0.05, 0.3], 2000)
    ids, _ = _sample(logits, [SamplingParams(top_p=0.7)] * 2000)
    assert set(ids) == {1, 3}
    assert abs(ids.count(1) / 2000 - 0.5 / 0.8) < 0.05  # renormalized over the nucleus


def test_top_k_and_top_p_rows_do_not_leak_into_each_other():
    torch.manual_seed(0)
    logits = _repeat([0.4, 0.3, 0.2, 0.1], 2000)
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.35)] * 1000
    ids, _ = _sample(logits, params)
    assert set(ids[0::2]) == {0, 1}  # top_k=2 row, top_p off, shares the sort path
    assert set(ids[1::2]) == {0}


def test_min_p_drops_tokens_below_fraction_of_best():
    torch.manual_seed(0)
    logits = _repeat([0.5, 0.3, 0.15, 0.05], 3000)  # min_p=0.2 -> keep p >= 0.1
    ids, _ = _sample(logits, [SamplingParams(min_p=0.2)] * 3000)
    assert set(ids) == {0, 1, 2}


def test_unseeded_sampling_matches_softmax():
    torch.manual_seed(1234)
    n, temperature = 8000, 0.8
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -2.0]).repeat(n, 1)
    ids, _ = _sample(logits, [SamplingParams(temperature=temperature)] * n)
    observed = torch.bincount(torch.tensor(ids), minlength=5).double()
    expected = (logits[0] / temperature).softmax(-1).double() * n
    chi_square = ((observed - expected) ** 2 / expected).sum().item()
    assert chi_square < 25, (observed, expected)  # df=4: p(chi2 > 25) < 1e-4


def _seeded_run(seed, position, companions, steps=6, vocab_size=200):
    """Tokens drawn for a seeded row at `position` of a batch padded with `companions`."""
    generator = make_generator(seed, CPU)
    logits_gen = torch.Generator().manual_seed(99)
    tokens = []
    for _ in range(steps):
        row_logits = torch.randn(1, vocab_size, generator=logits_gen)
        others = torch.randn(len(companions), vocab_size)  # global RNG: differs per run
        logits = torch.cat([others[:position], row_logits, others[position:]])
        params = list(companions)
        params.insert(position, SamplingParams(temperature=1.0, top_p=0.9, seed=seed))
        generators = [make_generator(p.seed, CPU) for p in companions]
        generators.insert(position, generator)
        ids, _ = _sample(logits, params, generators=generators)
        tokens.append(ids[position])
    return tokens


def test_seed_reproducible_across_batch_positions_and_companions():
    torch.manual_seed(0)
    alone = _seeded_run(7, 0, [])
    companions = [GREEDY, SamplingParams(temperature=0.7), SamplingParams(top_k=5, seed=1)]
    assert _seeded_run(7, 2, companions) == alone
    torch.manual_seed(999)  # the global RNG must not matter either
    assert _seeded_run(7, 1, companions[:2]) == alone
    assert _seeded_run(8, 0, []) != alone


def test_penalties_match_hand_computed_reference():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]] * 2)
    params = [
        SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
        SamplingParams(),
    ]
    prompts, outputs = [[0, 1], [0, 1]], [[1, 2, 2], [1, 2, 2]]
    penalties = Penalties.build(params, prompts, outputs, 5, CPU)
    processed = penalties.apply(logits)
    # rep: 0 -> 2/2, 1 -> -1*2, 2 -> 0.5/2; then output counts {1: 1, 2: 2}:
    # 1 -> -2 - 0.5 - 0.25, 2 -> 0.25 - 0.5 - 2 * 0.25; token 0 is prompt-only.
    expected = torch.tensor([1.0, -2.75, -0.75, 3.0, -2.0])
    assert torch.allclose(processed[0], expected), processed
    assert torch.equal(processed[1], logits[1])  # unpenalized row untouched


def test_repetition_window_sees_only_the_last_n_tokens_of_prompt_and_output():
    # llama.cpp's penalty_last_n: the window spans the prompt's tail and the output so far.
    logits = torch.ones(4, 6)
    params = [
        SamplingParams(repetition_penalty=2.0, repetition_last_n=3),  # prompt tail [3, 4] + output [5]
        SamplingParams(repetition_penalty=2.0, repetition_last_n=2),  # output only: [0, 5]
        SamplingParams(repetition_penalty=2.0),  # 0: the whole sequence, HF's semantics
        SamplingParams(repetition_penalty=2.0, repetition_last_n=100),  # longer than the sequence
    ]
    prompts, outputs = [[1, 2, 3, 4]] * 4, [[5], [0, 5], [5], [5]]
    processed = Penalties.build(params, prompts, outputs, 6, CPU).apply(logits)
    halved = lambda ids: torch.tensor([0.5 if i in ids else 1.0 for i in range(6)])
    assert torch.equal(processed[0], halved({3, 4, 5}))
    assert torch.equal(processed[1], halved({0, 5}))
    assert torch.equal(processed[2], halved({1, 2, 3, 4, 5}))
    assert torch.equal(processed[3], halved({1, 2, 3, 4, 5}))


def test_presence_and_frequency_ignore_prompt_tokens():
    logits = torch.zeros(1, 4)
    params = [SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)]
    processed = Penalties.build(params, [[0, 0, 3]], [[3]], 4, CPU).apply(logits)
    assert torch.equal(processed[0], torch.tensor([0.0, 0.0, 0.0, -2.0])), processed


def test_penalties_change_greedy_choice_end_to_end():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=1.2, logprobs=0)]
    ids, logprobs = _sample(logits, params, prompts=[[0]], outputs=[[]])
    assert ids == [1]
    reference = torch.tensor([2.5, 2.9, 0.0]).log_softmax(-1)
    assert logprobs[0].logprob == pytest.approx(reference[1].item(), abs=1e-6)


def test_logit_bias_forces_and_bans_tokens():
    torch.manual_seed(0)
    logits = torch.randn(4, 20)
    best = logits.argmax(-1).tolist()
    params = [
        SamplingParams(temperature=0, logit_bias=((13, 100.0),)),
        SamplingParams(temperature=1.0, logit_bias=((13, 100.0), (99, 5.0))),  # 99: ignored
        SamplingParams(temperature=0, logit_bias=((best[2], -100.0),)),
        GREEDY,
    ]
    ids, _ = _sample(logits, params)
    assert ids[:2] == [13, 13]
    assert ids[2] != best[2]
    assert ids[3] == best[3]


def test_logprobs_are_raw_log_softmax_before_temperature():
    torch.manual_seed(0)
    logits = torch.randn(3, 30)
    params = [
        SamplingParams(temperature=0.5, logprobs=5),
        SamplingParams(),
        SamplingParams(temperature=0, logprobs=0),
    ]
    ids, logprobs = _sample(logits, params)
    reference = logits.log_softmax(-1)
    first = logprobs[0]
    assert first.token_id == ids[0]
    assert first.logprob == pytest.approx(reference[0, ids[0]].item(), abs=1e-6)
    top_ids = [token_id for token_id, _ in first.top]
    assert top_ids == reference[0].topk(5).indices.tolist()
    values = [value for _, value in first.top]
    assert values == sorted(values, reverse=True)
    assert values == pytest.approx(reference[0].topk(5).values.tolist(), abs=1e-6)
    assert logprobs[1] is None
    assert logprobs[2].top == () and logprobs[2].token_id == ids[2]
    assert math.isclose(logprobs[2].logprob, reference[2].max().item(), abs_tol=1e-6)


def test_mixed_batch_rows_are_independent():
    torch.manual_seed(0)
    vocab_size = 64
    logits = torch.randn(5, vocab_size)
    rows = [
        (GREEDY, [], [], None),
        (SamplingParams(temperature=1.0, top_k=3), [], [], None),
        (SamplingParams(temperature=0.9, seed=5, logprobs=2), [], [], 5),
        (SamplingParams(temperature=0, repetition_penalty=3.0, frequency_penalty=1.0), [1, 2], [3, 3], None),
        (SamplingParams(temperature=1.2, top_p=0.8, min_p=0.05, seed=11), [], [], 11),
    ]

    def run(indices):
        params = [rows[i][0] for i in indices]
        generators = [make_generator(rows[i][3], CPU) for i in indices]
        return _sample(
            logits[indices],
            params,
            prompts=[rows[i][1] for i in indices],
            outputs=[rows[i][2] for i in indices],
            generators=generators,
        )

    batched_ids, batched_logprobs = run([0, 1, 2, 3, 4])
    for i in (0, 2, 3, 4):  # deterministic rows: same answer alone as in the batch
        alone_ids, alone_logprobs = run([i])
        assert batched_ids[i] == alone_ids[0], i
        assert batched_logprobs[i] == alone_logprobs[0], i
    assert batched_ids[1] in logits[1].topk(3).indices.tolist()
    assert batched_ids[0] == logits[0].argmax().item()


def test_top_k_only_path_leaves_rows_without_top_k_alone():
    torch.manual_seed(0)
    logits = _repeat([0.4, 0.3, 0.2, 0.1], 2000)
    ids, _ = _sample(logits, [SamplingParams(top_k=2), SamplingParams()] * 1000)
    assert set(ids[0::2]) == {0, 1}
    assert set(ids[1::2]) == {0, 1, 2, 3}


def test_logit_bias_is_additive():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    params = [SamplingParams(temperature=0, logprobs=0, logit_bias=((0, 1.5),))]
    ids, logprobs = _sample(logits, params)
    reference = torch.tensor([2.5, 2.0, 0.5]).log_softmax(-1)
    assert ids == [0]
    assert logprobs[0].logprob == pytest.approx(reference[0].item(), abs=1e-6)


def _bitmask(allowed_rows: list[list[int] | None], vocab_size: int) -> torch.Tensor:
    """[B, ceil(V/32)] int32; None rows allow everything."""
    words = torch.full((len(allowed_rows), (vocab_size + 31) // 32), -1, dtype=torch.int32)
    for row, allowed in enumerate(allowed_rows):
        if allowed is None:
            continue
        words[row].zero_()
        for token_id in allowed:
            word, bit = divmod(token_id, 32)
            words[row, word] |= torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32)
    return words


def test_token_bitmask_restricts_constrained_rows_only():
    torch.manual_seed(0)
    vocab = 70  # not a multiple of 32: the last word is partly past the vocabulary
    logits = torch.randn(4, vocab) * 4
    allowed = [[3, 31, 32, 69], None, [0], [45, 46]]
    params = [
        GREEDY,
        GREEDY,
        SamplingParams(temperature=1.5, seed=1),
        SamplingParams(temperature=1.0, top_k=2),
    ]
    batch = SamplingBatch.build(
        params,
        [[]] * 4,
        [[]] * 4,
        [None, None, make_generator(1, CPU), None],
        vocab,
        CPU,
        token_bitmask=_bitmask(allowed, vocab),
    )
    for _ in range(20):
        ids = Sampler()(logits, batch).sampled_token_ids.tolist()
        assert ids[0] == max([3, 31, 32, 69], key=lambda t: logits[0, t].item())
        assert ids[1] == logits[1].argmax().item()  # unconstrained row untouched
        assert ids[2] == 0 and ids[3] in (45, 46)


def test_force_greedy_overrides_temperature_for_that_row():
    logits = torch.tensor([[0.0, 0.1, 0.2]]).repeat(2, 1)
    params = [SamplingParams(temperature=5.0)] * 2
    batch = SamplingBatch.build(params, [[]] * 2, [[]] * 2, [None, None], 3, CPU, force_greedy=[True, False])
    draws = {tuple(Sampler()(logits, batch).sampled_token_ids.tolist()) for _ in range(60)}
    assert {d[0] for d in draws} == {2}  # greedy row
    assert len({d[1] for d in draws}) > 1  # the other still samples


def test_masked_logprobs_report_the_constrained_distribution():
    logits = torch.zeros(1, 8)
    params = [SamplingParams(temperature=0, logprobs=2)]
    batch = SamplingBatch.build(params, [[]], [[]], [None], 8, CPU, token_bitmask=_bitmask([[2, 5]], 8))
    output = Sampler()(logits, batch)
    assert output.sampled_token_ids.tolist() == [2]
    assert math.isclose(output.logprobs[0].logprob, math.log(0.5), abs_tol=1e-6)


def test_length_decay_raises_eos_as_transformers_exponential_decay_length_penalty():
    from transformers.generation.logits_process import ExponentialDecayLengthPenalty

    torch.manual_seed(0)
    logits = torch.randn(3, 12) * 4
    params = [
        SamplingParams(length_decay_start=3, length_decay_factor=1.5),
        SamplingParams(length_decay_start=3, length_decay_factor=1.5),  # not past the start yet
        SamplingParams(length_decay_start=3, length_decay_factor=1.5, ignore_eos=True),
    ]
    prompts, outputs = [[1, 2], [1, 2], [1, 2]], [[4, 4, 5, 6, 8], [4, 4, 5], [4, 4, 5, 6, 8]]
    eos = [(7, 9), (7, 9), (7, 9)]
    processed = Penalties.build(params, prompts, outputs, 12, CPU, eos_token_ids=eos).apply(logits)
    hf = ExponentialDecayLengthPenalty((3, 1.5), [7, 9], input_ids_seq_length=2)
    expected = hf(torch.tensor([prompts[0] + outputs[0]]), logits[:1].clone())
    torch.testing.assert_close(processed[0], expected[0])
    assert not torch.equal(processed[0], logits[0])
    assert torch.equal(processed[1:], logits[1:])  # before the start, and with ignore_eos: untouched


def test_length_decay_ends_a_greedy_answer_that_runs_on():
    logits = torch.tensor([[5.0, -1.0, 0.0]])  # token 1 is EOS, far behind
    params = [SamplingParams(temperature=0, length_decay_start=10, length_decay_factor=1.1)]
    eos = [(1,)]
    sampler = Sampler()
    chosen = []
    for n in range(10, 120):
        batch = SamplingBatch.build(params, [[0]], [[0] * n], [None], 3, CPU, eos_token_ids=eos)
        chosen.append(sampler(logits, batch).sampled_token_ids.item())
    first_eos = chosen.index(1) + 10
    # -1 + 1 * (1.1 ** k - 1) > 5 once 1.1 ** k > 7: k = 21 tokens past the start
    assert first_eos == 10 + 21


def test_length_decay_never_overflows_and_leaves_a_client_biased_eos_alone():
    logits = torch.tensor([[1.0, -2.0, 0.0], [1.0, -2.0, 0.0]])
    params = [
        SamplingParams(length_decay_start=0, length_decay_factor=10.0),  # 10 ** 5000 in Python floats
        SamplingParams(length_decay_start=0, length_decay_factor=10.0, logit_bias=((1, -100.0),)),
    ]
    outputs = [[0] * 5000, [0] * 5000]
    processed = Penalties.build(params, [[0], [0]], outputs, 3, CPU, eos_token_ids=[(1,), (1,)]).apply(logits)
    assert torch.isfinite(processed).all() and processed[0, 1] > 1e20
    assert torch.equal(processed[1], logits[1])


def test_top_p_within_top_k_equals_the_full_sort():
    """With a top-k on every sampled row, top-p reads only the top max_k (a partial topk, not a
    sort of the vocabulary): the same tokens, the same seeded draws; greedy rows mixed in."""
    torch.manual_seed(1)
    logits = torch.randn(4, 500) * 3
    params = [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1),
        SamplingParams(temperature=1.0, top_k=7, top_p=0.5, seed=2),
        GREEDY,
        SamplingParams(temperature=0.2, top_k=40, top_p=0.9, seed=3),
    ]
    fast = _batch(params, 500, generators=[make_generator(p.seed, CPU) for p in params])
    assert fast.top_k_bounds_all
    slow = _batch(params, 500, generators=[make_generator(p.seed, CPU) for p in params])
    slow.top_k_bounds_all = False
    for _ in range(5):
        assert torch.equal(
            Sampler()(logits, fast).sampled_token_ids, Sampler()(logits, slow).sampled_token_ids
        )
    without_k = [SamplingParams(temperature=0.8, top_p=0.9), params[0]]
    assert not _batch(without_k, 500).top_k_bounds_all
