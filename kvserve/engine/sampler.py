"""Sampler: picks the next token for every row of a batch on the device.

Per row, in order: logit_bias, penalties (repetition over prompt + output, presence and
frequency over output), the allowed-token mask of constrained rows (grammar), logprobs (from
these processed logits, before temperature; vLLM's default "processed_logprobs" minus
temperature, so a reported logprob does not depend on how the caller sampled), then greedy argmax, or temperature -> top-k -> top-p -> min-p ->
exponential-race sampling. Every stage is one batched op and is skipped when no row uses it;
the all-greedy, no-penalty, no-logprobs step is a single argmax with no host sync. A constraint may
also make a row greedy for one step (structural bytes of a tool call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.dry import dry_penalties
from kvserve.engine.request import Logprob
from kvserve.engine.sampling_params import SamplingParams

# Temperatures below this are treated as greedy: dividing by them overflows float32.
_MIN_TEMPERATURE = 1e-5
_TINY = torch.finfo(torch.float32).tiny


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """The per-request RNG, created once when the request starts; None means the global RNG."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def _is_greedy(params: SamplingParams) -> bool:
    return params.is_greedy or params.temperature < _MIN_TEMPERATURE


def is_plain_greedy(params: SamplingParams) -> bool:
    """Greedy with no stage before the argmax and no logprobs: the token is the logits' argmax."""
    return (
        _is_greedy(params) and not params.logit_bias and not params.has_penalties and params.logprobs is None
    )


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` ([B, V] -> [B]), first index on ties. On CUDA in two stages when V splits
    into 128 equal chunks: a one-row argmax over a 128K vocabulary is one thread block (~27 us on
    an H200). Both stages break ties toward the lower index, so the answer is the same."""
    num_rows, vocab = logits.shape
    if not logits.is_cuda or vocab % _ARGMAX_CHUNKS:
        return logits.argmax(dim=-1)
    chunk = vocab // _ARGMAX_CHUNKS
    chunk_max, chunk_index = logits.view(num_rows, _ARGMAX_CHUNKS, chunk).max(dim=-1)  # [B, chunks]
    best = chunk_max.argmax(dim=-1, keepdim=True)  # [B, 1]: the first chunk holding the maximum
    return (best * chunk + chunk_index.gather(1, best)).squeeze(1)


_ARGMAX_CHUNKS = 128


def logits_and_greedy(model, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`model.compute_logits(hidden)` and their greedy_argmax, in one fused kernel where the model
    has one (CausalLM.compute_logits_and_greedy)."""
    fused = getattr(model, "compute_logits_and_greedy", None)
    out = fused(hidden) if fused is not None else None
    if out is None:
        logits = model.compute_logits(hidden)
        out = (logits, greedy_argmax(logits))
    return out


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def _pad(rows: list[list[int]], pad_id: int) -> list[list[int]]:
    width = max(1, max(len(row) for row in rows))
    return [row + [pad_id] * (width - len(row)) for row in rows]


@dataclass
class Penalties:
    """Penalty tensors; built only when some row has a penalty."""

    repetition: torch.Tensor  # [B, 1] float32, 1.0 = off
    presence: torch.Tensor  # [B, 1] float32
    frequency: torch.Tensor  # [B, 1] float32
    seen_mask: torch.Tensor | None  # [B, V] bool: token in prompt or output; None: no repetition
    output_counts: torch.Tensor | None  # [B, V] float32; None: no presence/frequency
    dry: torch.Tensor | None = None  # [B, V] float32 to subtract (engine/dry.py); None: no DRY row
    # HF's exponential decay length penalty: (rows, EOS ids, factor ** steps past the start - 1)
    eos_boost: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        vocab_size: int,
        device: torch.device,
        dry_breakers: np.ndarray | None = None,
        eos_token_ids: list[tuple[int, ...]] | None = None,
    ) -> Penalties:
        """`dry_breakers`: [V] bool, the sequence-breaker tokens of DRY rows (None: no breakers);
        `eos_token_ids`: each row's end-of-sequence tokens (the length decay raises them)."""
        has_repetition = [p.repetition_penalty != 1 for p in params]
        has_additive = [p.presence_penalty != 0 or p.frequency_penalty != 0 for p in params]
        # Rows without a penalty contribute empty token lists, so padding stays small.
        outputs = [
            ids if rep or add else [] for ids, rep, add in zip(output_token_ids, has_repetition, has_additive)
        ]
        output_counts = _token_counts(outputs, vocab_size, device)
        seen_mask = None
        if any(has_repetition):
            seen = [
                _last_tokens(prompt, output, p.repetition_last_n) if rep else []
                for prompt, output, p, rep in zip(prompt_token_ids, output_token_ids, params, has_repetition)
            ]
            seen_mask = _token_counts(seen, vocab_size, device) > 0
        column = [[p.repetition_penalty] for p in params]
        return cls(
            repetition=_to_device(column, torch.float32, device),
            presence=_to_device([[p.presence_penalty] for p in params], torch.float32, device),
            frequency=_to_device([[p.frequency_penalty] for p in params], torch.float32, device),
            seen_mask=seen_mask,
            output_counts=output_counts if any(has_additive) else None,
            dry=_dry(params, output_token_ids, vocab_size, device, dry_breakers),
            eos_boost=_eos_boost(params, output_token_ids, eos_token_ids, vocab_size, device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.seen_mask is not None:
            # HF/CTRL: push seen tokens toward "less likely" whatever their sign.
            penalized = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(self.seen_mask, penalized, logits)
        if self.output_counts is not None:
            logits = logits - self.frequency * self.output_counts
            logits = logits - self.presence * (self.output_counts > 0).float()
        if self.dry is not None:
            logits = logits - self.dry
        if self.eos_boost is not None:
            rows, ids, growth = self.eos_boost
            eos = logits[rows, ids]
            logits = logits.index_put((rows, ids), eos + eos.abs() * growth)
        return logits


# The growth is capped where float32 still holds it (|logit| * 1e30); EOS has won long before.
_MAX_DECAY_LOG = math.log(1e30)


def _eos_boost(
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    eos_token_ids: list[tuple[int, ...]] | None,
    vocab_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Where the length decay raises EOS this step. A row whose logit_bias sets an EOS token keeps the
    client's choice for that token."""
    rows, ids, growth = [], [], []
    for row, (p, output) in enumerate(zip(params, output_token_ids)):
        past = len(output) - p.length_decay_start
        if p.length_decay_factor <= 1 or p.ignore_eos or past <= 0 or eos_token_ids is None:
            continue
        value = math.exp(min(past * math.log(p.length_decay_factor), _MAX_DECAY_LOG)) - 1
        biased = {token_id for token_id, _ in p.logit_bias}
        for token_id in eos_token_ids[row]:
            if 0 <= token_id < vocab_size and token_id not in biased:
                rows.append(row), ids.append(token_id), growth.append(value)
    if not rows:
        return None
    return (
        _to_device(rows, torch.int64, device),
        _to_device(ids, torch.int64, device),
        _to_device(growth, torch.float32, device),
    )


def _dry(
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    vocab_size: int,
    device: torch.device,
    breakers: np.ndarray | None,
) -> torch.Tensor | None:
    """[B, V] DRY penalties, built on the host (a few entries per row) and moved once."""
    if not any(p.dry_multiplier > 0 for p in params):
        return None
    if breakers is None:
        breakers = np.zeros(vocab_size, dtype=bool)
    dry = torch.zeros(len(params), vocab_size, dtype=torch.float32)
    for row, (p, output) in enumerate(zip(params, output_token_ids)):
        if p.dry_multiplier > 0:
            found = dry_penalties(output, breakers, p.dry_multiplier, p.dry_base, p.dry_allowed_length)
            for token_id, value in found.items():
                if 0 <= token_id < vocab_size:
                    dry[row, token_id] = value
    return dry.to(device, non_blocking=False)


def _last_tokens(prompt: list[int], output: list[int], last_n: int) -> list[int]:
    """The tokens a repetition penalty looks at: the whole sequence, or its last `last_n` (llama.cpp's
    penalty_last_n), without copying a long prompt."""
    if last_n <= 0:
        return prompt + output
    if len(output) >= last_n:
        return output[len(output) - last_n :]
    return prompt[max(0, len(prompt) - (last_n - len(output))) :] + output


def _token_counts(rows: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] float32 occurrence counts, one scatter_add; padding lands in a dropped column."""
    ids = _to_device(_pad(rows, vocab_size), torch.int64, device)  # [B, max_len]
    counts = torch.zeros(len(rows), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


@dataclass
class SamplingBatch:
    """The per-step sampling plan, rows in batch order. Optional tensors are None when no row
    needs that stage, which is how the sampler skips it."""

    num_rows: int
    vocab_size: int
    is_all_greedy: bool
    greedy_mask: torch.Tensor | None  # [B] bool; None when no row is greedy
    temperature: torch.Tensor | None  # [B, 1] float32, 1.0 on greedy rows; None if all greedy
    top_k: torch.Tensor | None  # [B] int64, vocab_size = off
    max_top_k: int
    top_k_bounds_all: bool  # every sampled row has a top-k: top-p needs only the top max_top_k
    top_p: torch.Tensor | None  # [B] float32, 1.0 = off
    min_p: torch.Tensor | None  # [B] float32, 0.0 = off
    seeded_rows: list[tuple[int, torch.Generator]]  # sampled (not greedy) rows with own RNG
    bias_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, token ids), [N] int64 each
    bias_values: torch.Tensor | None  # [N] float32
    penalties: Penalties | None
    num_logprobs: list[int | None]  # host-side, per row
    token_bitmask: torch.Tensor | None = None  # [B, ceil(V / 32)] int32, bit set = allowed; None: no mask

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device,
        token_bitmask: torch.Tensor | None = None,
        force_greedy: list[bool] | None = None,
        dry_breakers: np.ndarray | None = None,
        eos_token_ids: list[tuple[int, ...]] | None = None,
    ) -> SamplingBatch:
        """`token_bitmask` (host or device) and `force_greedy` come from the rows' token constraints;
        `dry_breakers` ([V] bool) are the tokenizer's DRY sequence breakers, `eos_token_ids` each
        row's end-of-sequence tokens (for the length decay)."""
        device = torch.device(device)
        num_rows = len(params)
        assert len(prompt_token_ids) == len(output_token_ids) == len(generators) == num_rows
        greedy = [
            _is_greedy(p) or (force_greedy is not None and force_greedy[row]) for row, p in enumerate(params)
        ]
        sampled = [p for p, g in zip(params, greedy) if not g]
        top_ks = [_top_k(p, vocab_size) if not g else vocab_size for p, g in zip(params, greedy)]
        any_top_k = any(k < vocab_size for k in top_ks)
        any_top_p = any(p.top_p < 1 for p in sampled)
        any_min_p = any(p.min_p > 0 for p in sampled)
        bias = [
            (row, token_id, value)
            for row, p in enumerate(params)
            for token_id, value in p.logit_bias
            # NOTE: the API layer rejects out-of-vocab ids; never index out of bounds here.
            if 0 <= token_id < vocab_size
        ]
        return cls(
            num_rows=num_rows,
            vocab_size=vocab_size,
            is_all_greedy=all(greedy),
            greedy_mask=_to_device(greedy, torch.bool, device) if any(greedy) else None,
            temperature=None
            if all(greedy)
            else _to_device(
                [[1.0 if g else p.temperature] for p, g in zip(params, greedy)], torch.float32, device
            ),
            top_k=_to_device(top_ks, torch.int64, device) if any_top_k else None,
            max_top_k=max((k for k in top_ks if k < vocab_size), default=0),
            top_k_bounds_all=any_top_k and all(k < vocab_size for k, g in zip(top_ks, greedy) if not g),
            top_p=_to_device([1.0 if g else p.top_p for p, g in zip(params, greedy)], torch.float32, device)
            if any_top_p
            else None,
            min_p=_to_device([0.0 if g else p.min_p for p, g in zip(params, greedy)], torch.float32, device)
            if any_min_p
            else None,
            seeded_rows=[
                (row, gen)
                for row, (gen, g) in enumerate(zip(generators, greedy))
                if gen is not None and not g
            ],
            bias_index=(
                _to_device([b[0] for b in bias], torch.int64, device),
                _to_device([b[1] for b in bias], torch.int64, device),
            )
            if bias
            else None,
            bias_values=_to_device([b[2] for b in bias], torch.float32, device) if bias else None,
            penalties=Penalties.build(
                params, prompt_token_ids, output_token_ids, vocab_size, device, dry_breakers, eos_token_ids
            )
            if any(p.has_penalties for p in params)
            else None,
            num_logprobs=[p.logprobs for p in params],
            token_bitmask=None if token_bitmask is None else token_bitmask.to(device, non_blocking=True),
        )


def _top_k(params: SamplingParams, vocab_size: int) -> int:
    return vocab_size if params.top_k <= 0 else min(params.top_k, vocab_size)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64 on device
    logprobs: list[Logprob | None]  # per row; None where not requested


class Sampler:
    """Stateless; per-request state (RNG, token history) comes in through SamplingBatch."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        assert logits.shape == (batch.num_rows, batch.vocab_size), logits.shape
        logits = logits.float()  # [B, V]
        if batch.bias_index is not None:
            logits = logits.index_put(batch.bias_index, batch.bias_values, accumulate=True)
        if batch.penalties is not None:
            logits = batch.penalties.apply(logits)
        if batch.token_bitmask is not None:
            logits = apply_token_bitmask(logits, batch.token_bitmask)
        if batch.is_all_greedy:
            sampled_ids = greedy_argmax(logits)
        else:
            sampled_ids = _sample(logits, batch)
        return SamplerOutput(sampled_ids, _logprobs(logits, sampled_ids, batch.num_logprobs))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """-inf where the row's bit is clear. [B, V] float32 logits, [B, ceil(V / 32)] int32 bitmask."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [B, W, 32]: bit i of word w is token 32 * w + i
    allowed = bits.view(bitmask.shape[0], -1)[:, : logits.shape[1]].bool()  # [B, V]
    return logits.masked_fill(~allowed, float("-inf"))


def _sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    assert batch.temperature is not None
    greedy_ids = greedy_argmax(logits) if batch.greedy_mask is not None else None
    logits = logits / batch.temperature
    if batch.top_k is not None or batch.top_p is not None:
        logits = _apply_top_k_top_p(logits, batch)
    if batch.min_p is not None:
        # p_i < min_p * p_max  <=>  logit_i < max_logit + log(min_p); no softmax needed.
        floor = logits.amax(dim=-1, keepdim=True) + batch.min_p.log().unsqueeze(1)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    probs = logits.softmax(dim=-1)
    # Exponential race: argmax(p / E), E ~ Exp(1), draws token i with probability p_i.
    noise = torch.empty_like(probs).exponential_()
    for row, generator in batch.seeded_rows:
        noise[row].exponential_(generator=generator)
    sampled_ids = probs.div_(noise.clamp_min_(_TINY)).argmax(dim=-1)
    if greedy_ids is not None:
        sampled_ids = torch.where(batch.greedy_mask, greedy_ids, sampled_ids)
    return sampled_ids


def _apply_top_k_top_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Mask all but the top-k / top-p nucleus. Both keep a prefix of the descending order, so
    each row reduces to one threshold logit (ties with it are kept)."""
    top_k, top_p = batch.top_k, batch.top_p
    if top_p is None:
        assert top_k is not None
        # Top-k only: a partial topk of max_k is much cheaper than sorting the vocabulary.
        top_values = logits.topk(batch.max_top_k, dim=-1).values  # [B, max_k]
        index = (top_k.clamp(max=batch.max_top_k) - 1).unsqueeze(1)
        threshold = top_values.gather(1, index)
        threshold = threshold.masked_fill((top_k >= batch.vocab_size).unsqueeze(1), float("-inf"))
    else:
        if batch.top_k_bounds_all:
            # Every sampled row keeps at most max_k tokens (llama.cpp's default top-k 40, applied
            # first as in its chain): the nucleus lies within the top max_k, whose descending values
            # a partial topk gives; sorting a 49K vocabulary cost ~10 ms a step on a CPU core.
            sorted_logits = logits.topk(batch.max_top_k, dim=-1).values  # [B, max_k], descending
        else:
            sorted_logits = logits.sort(dim=-1, descending=True).values  # [B, V], one sort
        num_kept = torch.full_like(top_p, sorted_logits.shape[1], dtype=torch.int64)  # [B]
        if top_k is not None:
            num_kept = top_k.clamp(max=sorted_logits.shape[1])  # (greedy rows: any; overridden)
            kth = sorted_logits.gather(1, (num_kept - 1).unsqueeze(1))
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
        # Top-p over the top-k renormalized distribution: keep token i while the mass strictly
        # before it is < top_p (so the top token always); top_p = 1 rows keep everything.
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        num_nucleus = (mass_before < top_p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
        num_nucleus = torch.where(top_p < 1, num_nucleus, sorted_logits.shape[1])
        num_kept = torch.minimum(num_kept, num_nucleus)
        threshold = sorted_logits.gather(1, (num_kept - 1).unsqueeze(1))
    return logits.masked_fill(logits < threshold, float("-inf"))


def _logprobs(
    logits: torch.Tensor, sampled_ids: torch.Tensor, num_logprobs: list[int | None]
) -> list[Logprob | None]:
    """Host Logprob objects for the rows that asked; the only sync besides the sampled ids."""
    rows = [row for row, k in enumerate(num_logprobs) if k is not None]
    if not rows:
        return [None] * len(num_logprobs)
    row_index = torch.tensor(rows, device=logits.device)
    logprobs = logits.index_select(0, row_index).log_softmax(dim=-1)  # [R, V] float32
    token_ids = sampled_ids.index_select(0, row_index).unsqueeze(1)  # [R, 1]
    ids, values = token_ids, logprobs.gather(1, token_ids)
    max_k = max(num_logprobs[row] or 0 for row in rows)
    if max_k > 0:
        top = logprobs.topk(max_k, dim=-1)  # sorted, best first
        ids, values = torch.cat([ids, top.indices], 1), torch.cat([values, top.values], 1)
    ids_host, values_host = ids.tolist(), values.tolist()
    result: list[Logprob | None] = [None] * len(num_logprobs)
    for i, row in enumerate(rows):
        k = num_logprobs[row] or 0
        top_pairs = tuple(zip(ids_host[i][1 : 1 + k], values_host[i][1 : 1 + k]))
        result[row] = Logprob(ids_host[i][0], values_host[i][0], top_pairs)
    return result
