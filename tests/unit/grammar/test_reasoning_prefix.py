"""A thinking model may (or, when the prompt opened the block, must) close its reasoning before the
forced output; the choice is made from the rendered prompt, like the output segmenter's."""

from __future__ import annotations

from kvserve.chat.conversation import ChatRequest, JsonFormat, Message, ReasoningControl, TextPart, ToolSpec
from kvserve.grammar.compiler import GrammarCompiler
from kvserve.grammar.lark import with_reasoning
from kvserve.grammar.tool_grammar import tool_call_grammar
from kvserve.reasoning import ReasoningSyntax
from kvserve.serving.constraints import DecodingConstraints
from tests.unit.grammar.grammar_helpers import accepts
from tests.unit.grammar.test_tool_grammar import GOLDEN, WEATHER

THINK = ReasoningSyntax("think", "<think>", "</think>")
CALL = GOLDEN["hermes"]


def test_open_block_must_close_before_the_call(compiler: GrammarCompiler) -> None:
    lark = with_reasoning(tool_call_grammar("hermes", (WEATHER,)), "<think>", "</think>", is_open=True)
    assert accepts(compiler.constraint(lark), "weather? call it.\n</think>\n\n" + CALL)
    assert not accepts(compiler.constraint(lark), CALL)


def test_model_may_think_or_not(compiler: GrammarCompiler) -> None:
    lark = with_reasoning(tool_call_grammar("hermes", (WEATHER,)), "<think>", "</think>", is_open=False)
    assert accepts(compiler.constraint(lark), CALL)
    assert accepts(compiler.constraint(lark), "<think>a <b> c</think>\n" + CALL)
    assert not accepts(compiler.constraint(lark), "</think>" + CALL)


def _request(**fields) -> ChatRequest:
    return ChatRequest(
        (Message("user", (TextPart("hi"),)),),
        tools=(ToolSpec(WEATHER.name, "", WEATHER.parameters),),
        **fields,
    )


def test_decoding_constraints_follow_the_rendered_prompt(compiler: GrammarCompiler) -> None:
    constraints = DecodingConstraints(compiler, "hermes", reasoning=THINK)
    opened = constraints.for_chat(_request(tool_choice="required"), prompt="<|im_start|>assistant\n<think>\n")
    assert accepts(opened, "ok</think>" + CALL)
    off = constraints.for_chat(
        _request(tool_choice="required", reasoning=ReasoningControl(enabled=False)), prompt="x"
    )
    assert not accepts(off, "<think>a</think>" + CALL)
    json_first = constraints.for_chat(_request(response_format=JsonFormat()), prompt="<think>")
    assert accepts(json_first, 'hmm</think>\n{"a": 1}')
