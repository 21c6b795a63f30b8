"""Grammar-constrained decoding through the real engine on a tiny random llama: whatever the random
weights prefer, the grammar's output is valid; free rows in the same batch are unaffected; preemption
keeps the matcher in step; a rejected token fails its request alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

from kvserve.engine.core import EngineCore
from kvserve.engine.request import FinishReason
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar.compiler import GrammarCompiler, tokenizer_factory
from kvserve.grammar.json_format import json_grammar
from kvserve.grammar.tool_grammar import tool_call_grammar
from kvserve.toolcalls import CallEnd, get_parser
from tests.api.fake_engine import EOS_ID, ByteTokenizer
from tests.engine.conftest import VOCAB, make_engine
from tests.engine.test_engine_core import _shrunk

TOKENIZER = ByteTokenizer()
COMPILER = GrammarCompiler(tokenizer_factory(TOKENIZER, VOCAB, (EOS_ID,)))
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
    "required": ["n", "ok", "tag"],
    "additionalProperties": False,
}
SAMPLED = SamplingParams(temperature=1.0, seed=7, max_tokens=200)


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _run(engine: EngineCore, jobs: list[tuple[list[int], SamplingParams, object]]):
    requests = [engine.make_request(f"r{i}", p, params, c) for i, (p, params, c) in enumerate(jobs)]  # type: ignore[arg-type]
    outputs = engine.generate(requests)
    tokens = [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests]
    return tokens, [outputs[r.request_id][-1] for r in requests], requests


def _text(tokens: list[int]) -> str:
    return TOKENIZER.decode([t for t in tokens if t != EOS_ID])


def _valid(value: dict) -> bool:
    return isinstance(value["n"], int) and isinstance(value["ok"], bool) and value["tag"] in ("a", "b")


def test_json_schema_output_is_valid_and_free_rows_are_unaffected(tiny_llama_dir: Path) -> None:
    free = SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    alone, _, _ = _run(make_engine(tiny_llama_dir), [(_prompt(20, 1), free, None)])
    jobs = [(_prompt(20, 1), free, None)]
    jobs += [
        (
            _prompt(15 + i, 10 + i),
            SamplingParams(temperature=1.0, seed=i, max_tokens=200),
            COMPILER.constraint(json_grammar(SCHEMA)),
        )
        for i in range(4)
    ]
    tokens, finals, _ = _run(make_engine(tiny_llama_dir), jobs)
    assert tokens[0] == alone[0]  # a constrained neighbour changes nothing for a free row
    for output, final in zip(tokens[1:], finals[1:]):
        assert final.finish_reason == FinishReason.STOP
        assert _valid(json.loads(_text(output)))


def test_forced_tool_call_is_valid_greedy_and_sampled(tiny_llama_dir: Path) -> None:
    from tests.unit.grammar.test_tool_grammar import SWITCH

    lark = tool_call_grammar("hermes", (SWITCH,), parallel=False)
    jobs = [
        (_prompt(12, 5), SamplingParams(temperature=0.0, max_tokens=200), COMPILER.constraint(lark)),
        (_prompt(12, 6), SAMPLED, COMPILER.constraint(lark)),
    ]
    tokens, finals, _ = _run(make_engine(tiny_llama_dir), jobs)
    for output, final in zip(tokens, finals):
        assert final.finish_reason == FinishReason.STOP
        parser = get_parser("hermes", (SWITCH,))
        ends = [e for e in parser.feed(_text(output)) + parser.finish() if isinstance(e, CallEnd)]
        assert len(ends) == 1
        arguments = json.loads(ends[0].arguments)
        assert isinstance(arguments["n"], int) and arguments["mode"] in ("on", "off")


def test_preemption_keeps_the_matcher_in_step(tiny_llama_dir: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 6, "maxItems": 6}
        },
        "required": ["items"],
        "additionalProperties": False,
    }

    def jobs():
        params = SamplingParams(temperature=0.0, max_tokens=100)
        return [(_prompt(100, 200 + i), params, COMPILER.constraint(json_grammar(schema))) for i in range(4)]

    roomy, _, _ = _run(make_engine(tiny_llama_dir), jobs())
    tight = make_engine(tiny_llama_dir, kv_cache_memory_mb=1)
    tight.kv_manager = tight.scheduler.kv = _shrunk(tight, num_blocks=25)
    tokens, finals, requests = _run(tight, jobs())
    assert sum(r.num_preemptions for r in requests) > 0
    assert tokens == roomy  # the recomputed requests saw the same masks
    for output, final in zip(tokens, finals):
        assert final.finish_reason == FinishReason.STOP
        assert len(json.loads(_text(output))["items"]) == 6


class _RejectThird:
    """A constraint that masks nothing and rejects the third token."""

    is_masking = False
    is_greedy = False
    is_finished = False

    def __init__(self) -> None:
        self.num_accepted_tokens = 0
        self.error: str | None = None

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        raise AssertionError("never asked: is_masking is False")

    def accept_token(self, token_id: int) -> bool:
        self.num_accepted_tokens += 1
        if self.num_accepted_tokens == 3:
            self.error = "third token refused"
        return self.error is None

    def reset(self) -> None:
        self.num_accepted_tokens, self.error = 0, None


def test_rejected_token_fails_its_request_alone(tiny_llama_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    engine = make_engine(tiny_llama_dir)
    tokens, finals, _ = _run(
        engine, [(_prompt(10, 1), params, _RejectThird()), (_prompt(10, 2), params, None)]
    )
    assert finals[0].finish_reason == FinishReason.ERROR and finals[0].error == "third token refused"
    assert len(tokens[0]) == 3
    assert finals[1].finish_reason == FinishReason.LENGTH and len(tokens[1]) == 10
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_usable_blocks


def test_unconstrained_batches_build_no_masks(engine: EngineCore) -> None:
    from kvserve.engine.runner.token_masks import NO_MASKS, build_token_masks

    requests = [engine.make_request(f"f{i}", [1, 2, 3], SAMPLED) for i in range(4)]
    assert build_token_masks(requests, VOCAB, pin_memory=False) is NO_MASKS
