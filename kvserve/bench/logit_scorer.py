"""Teacher-forced next-token log-probabilities of a chunk of text through an engine's own runner:
the same `build_model_inputs`, attention metadata, paged KV pool (at the engine's KV dtype), model
forward and LM head a served request runs, with the true tokens fed in place of sampled ones.

Three ways to feed a chunk (`ScoreMode`), because a served request computes its tokens on two paths:
- `prompt`: the whole chunk is one prompt, prefilled in steps of the engine's token budget
  (`--max-num-batched-tokens`, as the scheduler chunks a long prompt); every distribution comes
  from the prompt path (dense weights or `--bf16-prefill`/`--int8-prefill`, prompt attention).
- `decode`: the chunk up to its first scored position is the prompt; its last row gives the first
  distribution (as a served answer's first token), then each later token is fed as a one-token
  decode step, so the scored distributions and their KV come from the decode path (the low-bit
  `--weight-quant` kernels, decode attention) over a context the prompt path computed.
- `reuse`: every token after the first is a one-token decode step, the unscored half too, so the
  scored tokens attend to KV the decode path wrote: a next turn over the cached KV of the previous
  turn's answer (against `decode`, whose context KV the prompt path wrote: the same turn cold).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from kvserve.bench.quality_rows import ScoreMode
from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.request import Request
from kvserve.engine.runner.batch import build_model_inputs
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.attention.metadata import forward_context

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore


class LogitScorer:
    """Scores chunks on an idle engine, one at a time, in KV blocks 1..n of its pool (block 0 is
    the null block); nothing else may run on the engine meanwhile."""

    def __init__(self, engine: EngineCore, mode: ScoreMode):
        self._runner = engine.runner
        self._model = engine.runner.model
        self._block_size = engine.config.cache.block_size
        self._num_blocks = engine.num_blocks
        self._max_model_len = engine.max_model_len
        self._step_tokens = engine.config.scheduler.max_num_batched_tokens
        self._rope = engine.scheduler.rope
        self.mode = mode

    @torch.inference_mode()
    def logprobs(self, token_ids: list[int], first_scored: int) -> torch.Tensor:
        """Log-softmax rows [len(token_ids) - 1 - first_scored, vocab] (float32) of the distributions
        at positions first_scored .. len - 2 (each predicting the next token)."""
        if len(token_ids) > self._max_model_len:
            raise ValueError(
                f"a {len(token_ids)}-token chunk exceeds the engine's context ({self._max_model_len})"
            )
        num_blocks = -(-len(token_ids) // self._block_size)
        if num_blocks + 1 > self._num_blocks:
            raise ValueError(
                f"a {len(token_ids)}-token chunk needs {num_blocks + 1} KV blocks; the pool has {self._num_blocks}"
            )
        block_ids = list(range(1, num_blocks + 1))
        prompt_len = {"prompt": len(token_ids) - 1, "decode": first_scored + 1, "reuse": 1}[self.mode]
        num_answer = len(token_ids) - prompt_len
        request = Request("score", list(token_ids[:prompt_len]), SamplingParams(max_tokens=num_answer))
        # The RoPE regime the scheduler would give this request (rope_regime.py). A chunk it would
        # switch to the scaled regime on the way (past the trained context) is scored scaled throughout.
        rope = self._rope
        request.uses_trained_rope = (
            rope is not None and rope.fits(prompt_len, num_answer) and len(token_ids) <= rope.trained_context
        )
        rows = list(self._prefill(request, block_ids, first_scored))
        for position in range(prompt_len, len(token_ids) - 1):
            request.output_token_ids.append(token_ids[position])
            is_scored = position >= first_scored
            logits = self._forward(request, 1, block_ids, [0] if is_scored else [])
            if is_scored:
                rows.append(logits)
        return torch.cat(rows).log_softmax(dim=-1)

    def _prefill(self, request: Request, block_ids: list[int], first_scored: int) -> Iterator[torch.Tensor]:
        """The prompt in steps of the engine's token budget; the logits of its rows from first_scored on."""
        prompt_len = request.num_tokens
        for start in range(0, prompt_len, self._step_tokens):
            num_new = min(self._step_tokens, prompt_len - start)
            wanted = [row for row in range(num_new) if start + row >= first_scored]
            if wanted:
                yield self._forward(request, num_new, block_ids, wanted)
            else:
                self._forward(request, num_new, block_ids, [])

    def _forward(self, request: Request, num_new: int, block_ids: list[int], rows: list[int]) -> torch.Tensor:
        """One step of `num_new` tokens from request.num_computed_tokens; the logits [len(rows), vocab]."""
        scheduled = ScheduledRequest(request, num_new, block_ids)
        inputs = build_model_inputs([scheduled], self._block_size, self._runner.device)
        with forward_context(inputs.attn):
            hidden = self._model(inputs.input_ids, inputs.positions)  # [num_new, hidden_size]
        request.num_computed_tokens += num_new
        if not rows:
            return hidden.new_empty(0)
        return self._model.compute_logits(hidden[rows]).float()  # [len(rows), vocab]
