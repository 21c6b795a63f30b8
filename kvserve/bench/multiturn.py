"""`kvserve bench multiturn`: simulated coding agents replaying an agent-shaped session.

Every agent's conversation starts with the same system + tools prefix (Claude Code's, from the client
fixtures, fitted to a token budget), then alternates generated replies with ~N-token user turns that
carry tool results, so each turn re-sends its whole history. Per turn we record TTFT and the share of
the prompt the server reported as cached. Optionally the server is restarted between two turns (only
when the benchmark started it), which is what the disk KV tier is for. Agents arrive all at once
(closed loop: each sends its next turn as soon as the last reply ends) or as a Poisson process.
With `image_turns`, those turns' user messages open with a synthetic screenshot, distinct per (seed,
agent, turn), and later turns resend it with the history, as agents do: the image's hash is part of
the prompt's block hashes, so those turns should still be served from the prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvserve.bench.client import (
    STRICT,
    Api,
    HttpRequest,
    InlineImage,
    MessageContent,
    StreamRules,
    new_http_client,
    request_body,
    stream_request,
)
from kvserve.bench.datasets import CLAUDE_CODE_FIXTURE, Tokenizer
from kvserve.bench.metrics import RequestResult
from kvserve.bench.screenshots import PNG_MEDIA_TYPE, base64_png, screenshot
from kvserve.bench.serve_bench import LoadShape, arrival_offsets


@dataclass(frozen=True)
class MultiturnConfig:
    num_agents: int = 1
    num_turns: int = 8
    prefix_tokens: int = 12_000
    user_tokens: int = 200
    output_tokens: int = 100
    restart_after_turn: int | None = None  # restart between this turn and the next (needs a restart hook)
    session_rate: float | None = None  # Poisson arrivals of agents per second; None = closed loop
    think_time_s: float = 0.0
    seed: int = 0
    fixture: Path = CLAUDE_CODE_FIXTURE  # an Anthropic Messages request body: its system + tools
    image_turns: tuple[int, ...] = ()  # 1-based turns whose user message carries a screenshot
    image_size: tuple[int, int] = (1920, 1080)  # (width, height) of those screenshots


@dataclass(frozen=True)
class TurnResult:
    agent: int
    turn: int  # 1-based
    is_after_restart: bool
    result: RequestResult
    num_images: int = 0  # images this turn's own user message carried (its history may hold more)

    @property
    def cached_ratio(self) -> float | None:
        r = self.result
        if r.cached_tokens is None or not r.prompt_len:
            return None
        return r.cached_tokens / r.prompt_len


@dataclass(frozen=True)
class SessionText:
    """The shared prefix and the text pool that user turns are cut from."""

    system_prompt: str
    prefix_len: int  # tokens of system_prompt
    pool_ids: tuple[int, ...]


def load_session_text(
    tokenizer: Tokenizer, prefix_tokens: int, fixture: Path = CLAUDE_CODE_FIXTURE
) -> SessionText:
    """Claude Code's system prompt and tool schemas as one system message of ~prefix_tokens tokens.

    The per-request billing header block is dropped (it changes on every request and would defeat any
    cache); the tools are rendered as JSON lines so every server sees the same prompt whatever its
    chat template does with a `tools` field. Too short → the tool list repeats; too long → cut.
    """
    request = json.loads(fixture.read_text())
    system = [b["text"] for b in request["system"] if not b["text"].startswith("x-anthropic-billing-header")]
    tools = "\n".join(json.dumps(t, sort_keys=True) for t in request["tools"])
    base = "\n\n".join(system).strip() + "\n\n# Tools\n\nYou may call one or more of these tools:\n"
    text = base + tools
    while len(tokenizer.encode(text, add_special_tokens=False)) < prefix_tokens:
        text += "\n" + tools
    ids = tokenizer.encode(text, add_special_tokens=False)[:prefix_tokens]
    system_prompt = tokenizer.decode(ids)
    pool = tokenizer.encode(tools + "\n" + "\n\n".join(system), add_special_tokens=False)
    return SessionText(
        system_prompt, len(tokenizer.encode(system_prompt, add_special_tokens=False)), tuple(pool)
    )


def user_turn_text(
    tokenizer: Tokenizer, text: SessionText, agent: int, turn: int, num_tokens: int, seed: int
) -> str:
    """Turn 1: a task; later turns: a tool result. Distinct per (agent, turn), so only the system
    prefix (and each agent's own history) can be shared."""
    rng = random.Random(f"{seed}/{agent}/{turn}")
    start = rng.randrange(max(1, len(text.pool_ids) - num_tokens))
    body = tokenizer.decode(list(text.pool_ids[start : start + num_tokens]))
    if turn == 1:
        return f"Agent {agent}: read these notes, then fix the failing test they describe.\n\n{body}"
    return f"Tool result (call_{agent}_{turn - 1}, Read):\n```\n{body}\n```\nContinue with the task."


def turn_screenshot(seed: int, agent: int, turn: int, size: tuple[int, int]) -> InlineImage:
    """The screenshot of one (seed, agent, turn): the same bytes on every run, distinct across turns."""
    key = zlib.crc32(f"{seed}/{agent}/{turn}".encode())
    return InlineImage(PNG_MEDIA_TYPE, base64_png(screenshot(key, size)))


class AgentSession:
    """One agent's growing conversation."""

    def __init__(self, agent: int, system_prompt: str) -> None:
        self.agent = agent
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
        self.is_broken = False  # a failed turn ends the session: its history would be made up

    def prompt_len_estimate(self, tokenizer: Tokenizer) -> int:
        """Text tokens only: an image's token count depends on the server's processor (tiling), so
        images are left out; the estimate only stands in when the server reports no usage."""
        return sum(
            len(tokenizer.encode(part, add_special_tokens=False))
            for m in self.messages
            for part in ([m["content"]] if isinstance(m["content"], str) else m["content"])
            if isinstance(part, str)
        )


@dataclass(frozen=True)
class MultiturnTarget:
    base_url: str
    model: str | None = None
    api: Api = Api.CHAT
    rules: StreamRules = STRICT
    logit_bias: dict[str, float] | None = None
    # Sent with each agent's id, as agents do (Claude Code: X-Claude-Code-Session-Id): what a
    # session-affine router (`kvserve cluster`) keeps a conversation on one replica by.
    session_header: str | None = None


class MultiturnBench:
    """Runs the sessions turn range by turn range, so a restart can sit between two ranges."""

    def __init__(
        self, target: MultiturnTarget, tokenizer: Tokenizer, config: MultiturnConfig, progress: bool = True
    ):
        self.target, self.tokenizer, self.config, self.progress = target, tokenizer, config, progress
        self.text = load_session_text(tokenizer, config.prefix_tokens, config.fixture)
        self.sessions = [AgentSession(a, self.text.system_prompt) for a in range(config.num_agents)]
        self.completed: list[TurnResult] = []
        # Drawn up front: a 1920x1080 PNG takes ~0.1 s, which inside the event loop would delay
        # reading the other agents' streams and inflate their TTFTs.
        self.screenshots = {
            (a, t): turn_screenshot(config.seed, a, t, config.image_size)
            for a in range(config.num_agents)
            for t in config.image_turns
            if t <= config.num_turns
        }

    def run(self, restart: Callable[[], object] | None = None) -> list[TurnResult]:
        """All turns; `restart` (blocking) is called after `restart_after_turn` when both are given."""
        cut = self.config.restart_after_turn
        if cut is None or restart is None or not 0 < cut < self.config.num_turns:
            return asyncio.run(self._turns(1, self.config.num_turns, is_after_restart=False, stagger=True))
        before = asyncio.run(self._turns(1, cut, is_after_restart=False, stagger=True))
        self.completed = before  # what the hook may look at (bench cluster: which replica to kill)
        restart()
        return before + asyncio.run(
            self._turns(cut + 1, self.config.num_turns, is_after_restart=True, stagger=False)
        )

    async def _turns(self, first: int, last: int, is_after_restart: bool, stagger: bool) -> list[TurnResult]:
        shape = LoadShape(request_rate=self.config.session_rate or float("inf"), seed=self.config.seed)
        offsets = arrival_offsets(len(self.sessions), shape) if stagger else [0.0] * len(self.sessions)
        total = len(self.sessions) * (last - first + 1)
        bar = tqdm(
            total=total, desc=f"multiturn turns {first}-{last}", disable=not self.progress, unit="turn"
        )
        async with new_http_client() as http:
            start = time.perf_counter()

            async def agent_loop(session: AgentSession, offset: float) -> list[TurnResult]:
                await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                out = []
                for turn in range(first, last + 1):
                    if session.is_broken:
                        break
                    out.append(await self._one_turn(http, session, turn, is_after_restart))
                    bar.update(1)
                    if self.config.think_time_s:
                        await asyncio.sleep(self.config.think_time_s)
                return out

            per_agent = await asyncio.gather(
                *(agent_loop(s, o) for s, o in zip(self.sessions, offsets, strict=True))
            )
        bar.close()
        return sorted((r for rs in per_agent for r in rs), key=lambda r: (r.turn, r.agent))

    async def _one_turn(
        self, http: Any, session: AgentSession, turn: int, is_after_restart: bool
    ) -> TurnResult:
        c = self.config
        text = user_turn_text(self.tokenizer, self.text, session.agent, turn, c.user_tokens, c.seed)
        image = self.screenshots.get((session.agent, turn))
        images = [image] if image else []
        user: MessageContent = [*images, text] if images else text  # the image before the text
        session.messages.append({"role": "user", "content": user})
        body = request_body(
            self.target.api,
            session.messages,
            c.output_tokens,
            model=self.target.model,
            logit_bias=self.target.logit_bias,
        )
        headers = ()
        if self.target.session_header:
            headers = ((self.target.session_header, f"kvserve-bench-{c.seed}-{session.agent}"),)
        request = HttpRequest(self.target.api, body, session.prompt_len_estimate(self.tokenizer), headers)
        result = await stream_request(http, self.target.base_url, request, self.target.rules)
        if result.is_success:
            session.messages.append({"role": "assistant", "content": result.generated_text})
        else:
            session.is_broken = True
        return TurnResult(session.agent, turn, is_after_restart, result, len(images))


@dataclass(frozen=True)
class TurnSummary:
    turn: int
    num_ok: int
    num_failed: int
    is_after_restart: bool
    has_image: bool  # the turn's user messages carried a screenshot
    p50_ttft_ms: float | None
    mean_ttft_ms: float | None
    p50_cached_ratio: float | None  # None when the server reports no cached tokens


def summarize_turns(results: list[TurnResult]) -> list[TurnSummary]:
    """Per turn, across agents: p50 / mean TTFT and the median cached share of the prompt (pure)."""
    import statistics

    summaries = []
    for turn in sorted({r.turn for r in results}):
        rows = [r for r in results if r.turn == turn]
        ok = [r for r in rows if r.result.is_success]
        ttfts = [r.result.ttft * 1000.0 for r in ok]
        ratios = [x for x in (r.cached_ratio for r in ok) if x is not None]
        summaries.append(
            TurnSummary(
                turn=turn,
                num_ok=len(ok),
                num_failed=len(rows) - len(ok),
                is_after_restart=any(r.is_after_restart for r in rows),
                has_image=any(r.num_images for r in rows),
                p50_ttft_ms=statistics.median(ttfts) if ttfts else None,
                mean_ttft_ms=statistics.fmean(ttfts) if ttfts else None,
                p50_cached_ratio=statistics.median(ratios) if ratios else None,
            )
        )
    return summaries
