"""GrammarConstraint as the engine sees it: masks, finishing, errors, and rebuilding from tokens."""

from __future__ import annotations

from kvserve.engine.constraint import catch_up
from kvserve.grammar.compiler import GrammarCompiler
from kvserve.grammar.json_format import json_grammar
from tests.unit.grammar.grammar_helpers import TOKENIZER, allowed_ids

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "boolean"}},
    "required": ["a"],
    "additionalProperties": False,
}


def test_catch_up_rebuilds_the_state_from_the_output_tokens(compiler: GrammarCompiler) -> None:
    tokens = TOKENIZER.encode('{"a": t')
    direct = compiler.constraint(json_grammar(SCHEMA))
    assert all(direct.accept_token(t) for t in tokens)
    rebuilt = compiler.constraint(json_grammar(SCHEMA))
    rebuilt.accept_token(tokens[0])  # out of step with the request's output
    catch_up(rebuilt, tokens)
    assert rebuilt.num_accepted_tokens == len(tokens)
    assert allowed_ids(rebuilt) == allowed_ids(direct) == [ord("r")]
    catch_up(rebuilt, tokens)  # in step: nothing replayed
    assert rebuilt.num_accepted_tokens == len(tokens)


def test_finishes_when_only_end_of_sequence_remains(compiler: GrammarCompiler) -> None:
    constraint = compiler.constraint(json_grammar(SCHEMA))
    text = '{"a": true}'
    for i, token_id in enumerate(TOKENIZER.encode(text)):
        assert not constraint.is_finished
        assert constraint.accept_token(token_id), text[: i + 1]
    assert constraint.is_finished and constraint.error is None


def test_a_rejected_token_is_an_error(compiler: GrammarCompiler) -> None:
    constraint = compiler.constraint(json_grammar(SCHEMA))
    assert not constraint.accept_token(ord("x"))
    assert constraint.error and not constraint.is_finished


def test_wider_model_vocabulary_leaves_unknown_tokens_disallowed(compiler: GrammarCompiler) -> None:
    import torch

    constraint = compiler.constraint(json_grammar(None))
    words = torch.zeros(20, dtype=torch.int32)  # 640 "model" tokens, the tokenizer knows 259
    constraint.fill_bitmask(words.data_ptr(), words.numel() * 4)
    allowed = [i for i in range(640) if (int(words[i // 32]) >> (i % 32)) & 1]
    assert allowed == [ord("{")]


def test_a_tokenizer_llguidance_cannot_wrap_degrades_cleanly() -> None:
    import pytest

    from kvserve.chat.conversation import (
        ChatRequest,
        GenerationOptions,
        Message,
        SamplingOptions,
        TextPart,
        ToolSpec,
    )
    from kvserve.serving.constraints import DecodingConstraints
    from kvserve.serving.errors import RequestError

    def unwrappable():
        raise ValueError("Only fast tokenizers are supported")

    constraints = DecodingConstraints(GrammarCompiler(unwrappable), "hermes")
    request = ChatRequest(
        (Message("user", (TextPart("hi"),)),),
        GenerationOptions(SamplingOptions(temperature=0.7)),
        tools=(ToolSpec("f"),),
    )
    assert constraints.for_chat(request) is None  # "auto": no structural greedy, no failure
    with pytest.raises(RequestError, match="unavailable") as caught:
        constraints.for_chat(
            ChatRequest(request.messages, request.options, request.tools, tool_choice="required")
        )
    assert caught.value.param == "tools"
