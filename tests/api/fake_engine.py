"""A scripted engine and a byte-level tokenizer: protocol tests without a model.

`FakeEngine` satisfies `EngineClient`: it streams a scripted reply one token per
output, honours max_tokens/EOS like the scheduler, reports a block-aligned prefix-cache
hit against earlier prompts, and records running and aborted requests. Optionally it
reports prefill chunks as token-less progress outputs (as EngineCore does) and scripted
logprobs: token i has logprob -(i+1)/10, and its k alternatives are itself and the next bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kvserve.engine.constraint import TokenConstraint
from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import EngineOutput
from kvserve.engine.request import CheckpointHint, FinishReason, Logprob
from kvserve.engine.sampling_params import SamplingParams

SPECIAL_TOKENS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}
EOS_ID = SPECIAL_TOKENS["<|im_end|>"]
BLOCK_SIZE = 16


class ByteTokenizer:
    """Token ids 0-255 are bytes; 256+ are special tokens, matched whole in the text."""

    bos_token = "<|endoftext|>"
    eos_token = "<|im_end|>"
    # llguidance's TokenizerWrapper protocol, so grammars compile against this vocabulary too.
    bos_token_id = SPECIAL_TOKENS["<|endoftext|>"]
    eos_token_id = EOS_ID
    special_token_ids: ClassVar[list[int]] = list(SPECIAL_TOKENS.values())
    tokens = [bytes([i]) for i in range(256)] + [name.encode() for name in SPECIAL_TOKENS]

    def __len__(self) -> int:
        return 256 + len(SPECIAL_TOKENS)

    def __call__(self, text: str | bytes) -> list[int]:
        return self.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in SPECIAL_TOKENS if text.startswith(s, i)), None)
            if special is not None:
                ids.append(SPECIAL_TOKENS[special])
                i += len(special)
            else:
                ids.extend(text[i].encode("utf-8", "surrogatepass"))
                i += 1
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        names = {v: k for k, v in SPECIAL_TOKENS.items()}
        out, pending = [], bytearray()
        for token_id in token_ids:
            if token_id < 256:
                pending.append(token_id)
                continue
            out.append(pending.decode("utf-8", "replace"))
            pending.clear()
            if not skip_special_tokens:
                out.append(names[token_id])
        out.append(pending.decode("utf-8", "replace"))
        return "".join(out)


@dataclass(frozen=True)
class FakeTokenizerInfo:
    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer)
    chat_template: str | None = None  # the ChatML fallback
    bos_token_id: int | None = SPECIAL_TOKENS["<|endoftext|>"]
    eos_token_ids: tuple[int, ...] = (EOS_ID,)
    add_bos_token: bool = False


def reply(text: str, eos: bool = True) -> list[int]:
    """Token ids of a scripted reply, ending with EOS by default."""
    return ByteTokenizer().encode(text) + ([EOS_ID] if eos else [])


def scripted_logprob(index: int, token_id: int, k: int) -> Logprob:
    value = -(index + 1) / 10
    top = tuple((token_id if j == 0 else (token_id + j) % 256, value - j) for j in range(k))
    return Logprob(token_id, value, top)


Script = list[int] | Callable[[list[int]], list[int]]


class FakeEngine:
    def __init__(
        self,
        script: Script = (),
        token_delay_s: float = 0.0,
        prefill_delay_s: float = 0.0,
        fail_after: int | None = None,
        num_prefill_chunks: int = 0,
        chunk_delay_s: float = 0.0,
        eos_token_id: int = EOS_ID,
    ):
        self.script = script
        self.token_delay_s = token_delay_s
        self.prefill_delay_s = prefill_delay_s
        self.num_prefill_chunks = num_prefill_chunks  # progress outputs before the first token
        self.chunk_delay_s = chunk_delay_s
        self.fail_after = fail_after  # raise after this many tokens (an engine failure mid-stream)
        self.eos_token_id = eos_token_id  # another tokenizer's (tests with a real tokenizer)
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.request_ids: list[str] = []
        self.constraints: list[TokenConstraint | None] = []  # per request, in order (not applied)
        self.checkpoint_hints: list[CheckpointHint | None] = []  # per request, in order (no disk tier)
        self.images: list[tuple[ImageInput, ...]] = []  # per request, in order
        self._history: list[list[int]] = []

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        checkpoint_hint: CheckpointHint | None = None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncIterator[EngineOutput]:
        self.requests.append((list(prompt_token_ids), params))
        self.constraints.append(constraint)
        self.checkpoint_hints.append(checkpoint_hint)
        self.images.append(tuple(images))
        self.request_ids.append(request_id)
        cached = self._cached_tokens(prompt_token_ids)
        tokens = self.script(prompt_token_ids) if callable(self.script) else list(self.script)
        self.running.add(request_id)
        generated: list[int] = []
        finished = False
        try:
            await asyncio.sleep(self.prefill_delay_s)
            for computed in self._chunk_ends(len(prompt_token_ids), cached):
                await asyncio.sleep(self.chunk_delay_s)
                yield EngineOutput(
                    request_id,
                    (),
                    num_prompt_tokens=len(prompt_token_ids),
                    num_cached_tokens=cached,
                    num_computed_tokens=computed,
                )
            for i, token_id in enumerate(tokens[: params.max_tokens]):
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("engine exploded")
                await asyncio.sleep(self.token_delay_s)
                generated.append(token_id)
                is_last = i + 1 == min(len(tokens), params.max_tokens)
                reason = self._finish_reason(token_id, params, is_last, len(tokens))
                finished = reason is not None
                yield EngineOutput(
                    request_id,
                    (token_id,),
                    new_logprobs=self._logprobs(i, token_id, params),
                    finish_reason=reason,
                    num_prompt_tokens=len(prompt_token_ids),
                    num_cached_tokens=cached,
                )
                if finished:
                    return
            # A script shorter than max_tokens without EOS ends as if the context filled up.
            finished = True
            yield EngineOutput(
                request_id,
                (),
                finish_reason=FinishReason.LENGTH,
                num_prompt_tokens=len(prompt_token_ids),
                num_cached_tokens=cached,
            )
        finally:
            self.running.discard(request_id)
            self._history.append(list(prompt_token_ids) + generated)
            if not finished:
                self.aborted.append(request_id)

    def abort(self, request_id: str) -> None:
        """Nothing to stop: a scripted stream ends when its consumer closes it (recorded then)."""

    def shutdown(self, timeout: float = 120.0) -> None:
        pass

    @property
    def is_running(self) -> bool:
        return True

    @staticmethod
    def _logprobs(index: int, token_id: int, params: SamplingParams) -> tuple[Logprob, ...]:
        return () if params.logprobs is None else (scripted_logprob(index, token_id, params.logprobs),)

    def _chunk_ends(self, num_prompt: int, cached: int) -> list[int]:
        """Computed-token counts after each chunk but the last (which samples), like EngineCore."""
        n = self.num_prefill_chunks
        return [cached + (num_prompt - cached) * i // (n + 1) for i in range(1, n + 1)]

    def _finish_reason(
        self, token_id: int, params: SamplingParams, is_last: bool, n: int
    ) -> FinishReason | None:
        if token_id == self.eos_token_id and not params.ignore_eos:
            return FinishReason.STOP
        if is_last and n >= params.max_tokens:
            return FinishReason.LENGTH
        return None

    def _cached_tokens(self, prompt: list[int]) -> int:
        best = 0
        for seen in self._history:
            n = 0
            for a, b in zip(seen, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best // BLOCK_SIZE * BLOCK_SIZE, max(len(prompt) - 1, 0))
