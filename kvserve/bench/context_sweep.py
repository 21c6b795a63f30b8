"""`kvserve bench context`: prefill and decode throughput as the context grows (ds4-bench style).

Probe i sends a prompt of `frontiers[i]` tokens that extends probe i−1's prompt, generating
`decode_tokens`; the server restores the cached prefix (the previous frontier's KV, not the previous
probe's generated tokens), so only the new interval is prefilled. Per frontier:
- prefill tok/s = tokens prefilled / TTFT, with tokens prefilled = prompt − cached (from usage; when the
  server reports no cached count, the interval since the previous frontier, flagged `assumed`);
- decode tok/s = (output tokens − 1) / (E2EL − TTFT), i.e. 1 / TPOT at that context length.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from kvserve.bench.client import (
    STRICT,
    Api,
    HttpRequest,
    StreamRules,
    new_http_client,
    request_body,
    stream_request,
)
from kvserve.bench.datasets import CLAUDE_CODE_FIXTURE, Tokenizer
from kvserve.bench.metrics import RequestResult


@dataclass(frozen=True)
class ContextPoint:
    frontier: int  # prompt tokens asked for
    interval_start: int  # the previous frontier (0 for the first probe)
    prompt_tokens: int
    cached_tokens: int | None
    prefilled_tokens: int
    is_prefill_assumed: bool  # no cached count from the server: prefilled = the interval
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    output_tokens: int
    error: str = ""

    def row(self) -> dict[str, object]:
        return asdict(self)


def context_corpus(tokenizer: Tokenizer, num_tokens: int, fixture: Path = CLAUDE_CODE_FIXTURE) -> list[int]:
    """Realistic text (Claude Code's prompt and tools, repeated) of at least num_tokens tokens."""
    request = json.loads(fixture.read_text())
    parts = [b["text"] for b in request["system"] if not b["text"].startswith("x-anthropic-billing-header")]
    parts += [json.dumps(t, sort_keys=True) for t in request["tools"]]
    unit = tokenizer.encode("\n\n".join(parts), add_special_tokens=False)
    repeats = num_tokens // len(unit) + 1
    return (unit * repeats)[:num_tokens]


def frontier_prompts(
    tokenizer: Tokenizer, frontiers: list[int], fixture: Path = CLAUDE_CODE_FIXTURE
) -> list[str]:
    """Prompt i is a prefix (as text) of prompt i+1."""
    if frontiers != sorted(set(frontiers)) or frontiers[0] < 1:
        raise ValueError(f"frontiers must be increasing positive token counts, got {frontiers}")
    corpus = context_corpus(tokenizer, frontiers[-1], fixture)
    longest = tokenizer.decode(corpus)
    # Cut the one longest text at token boundaries, so every prompt is a text prefix of the next.
    return [tokenizer.decode(corpus[:f]) if f < frontiers[-1] else longest for f in frontiers]


def point(frontier: int, previous: int, result: RequestResult, fallback_prompt_len: int) -> ContextPoint:
    """One probe's figures from its RequestResult (pure)."""
    if not result.is_success:
        return ContextPoint(
            frontier, previous, fallback_prompt_len, None, 0, True, 0.0, 0.0, 0.0, 0, result.error
        )
    is_assumed = result.cached_tokens is None
    prefilled = (
        frontier - previous if result.cached_tokens is None else result.prompt_len - result.cached_tokens
    )
    decode_time = result.latency - result.ttft
    return ContextPoint(
        frontier=frontier,
        interval_start=previous,
        prompt_tokens=result.prompt_len,
        cached_tokens=result.cached_tokens,
        prefilled_tokens=prefilled,
        is_prefill_assumed=is_assumed,
        ttft_s=result.ttft,
        prefill_tok_s=prefilled / result.ttft if result.ttft > 0 else 0.0,
        decode_tok_s=(result.output_len - 1) / decode_time
        if decode_time > 0 and result.output_len > 1
        else 0.0,
        output_tokens=result.output_len,
    )


async def run_context_sweep(
    base_url: str,
    tokenizer: Tokenizer,
    frontiers: list[int],
    decode_tokens: int,
    *,
    model: str | None = None,
    rules: StreamRules = STRICT,
    logit_bias: dict[str, float] | None = None,
    progress: bool = True,
    fixture: Path = CLAUDE_CODE_FIXTURE,
) -> list[ContextPoint]:
    prompts = frontier_prompts(tokenizer, frontiers, fixture)
    points: list[ContextPoint] = []
    async with new_http_client() as http:
        previous = 0
        for frontier, prompt in tqdm(
            list(zip(frontiers, prompts, strict=True)),
            desc="bench context",
            disable=not progress,
            unit="probe",
        ):
            body = request_body(Api.COMPLETIONS, prompt, decode_tokens, model=model, logit_bias=logit_bias)
            result = await stream_request(http, base_url, HttpRequest(Api.COMPLETIONS, body, frontier), rules)
            points.append(point(frontier, previous, result, frontier))
            previous = frontier
    return points
