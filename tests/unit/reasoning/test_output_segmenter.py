"""The serving composer: reasoning first, then tool calls; markup inside reasoning is never a call."""

from __future__ import annotations

import itertools

import pytest
from split_points import assert_split_invariant
from toolcall_cases import GOLDEN
from toolcall_cases import TOOLS as SCHEMA_TOOLS

from kvserve.chat.conversation import ChatRequest, Message, ReasoningControl, TextPart, ToolSpec
from kvserve.chat.detokenizer import IncrementalDetokenizer
from kvserve.chat.stop import StopMatcher
from kvserve.reasoning import SYNTAXES as REASONING
from kvserve.reasoning import ReasoningSegmenter
from kvserve.serving.events import ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from kvserve.serving.output_pipeline import OutputPipeline
from kvserve.serving.segmenter import ModelOutputSegmenter, OutputSyntax
from kvserve.toolcalls import UnknownToolParserError, get_parser

TOOLS = tuple(ToolSpec(t.name, "", t.parameters) for t in SCHEMA_TOOLS)
REQUEST = ChatRequest(messages=(Message("user", (TextPart("hi"),)),), tools=TOOLS)
# One well-formed call per syntax, from the golden cases.
CALLS = {
    name: next((text, exp) for text, exp in cases if [e[0] for e in exp] == ["call"])
    for name, cases in GOLDEN.items()
}


def _segmenter(syntax: str, inside: bool = False, tools: bool = True) -> ModelOutputSegmenter:
    ids = (f"{i:032x}" for i in itertools.count())
    return ModelOutputSegmenter(
        ReasoningSegmenter(REASONING["think"], starts_in_reasoning=inside),
        get_parser(syntax, TOOLS) if tools else None,
        call_id_factory=lambda: next(ids),
    )


def _compact(events: list) -> list[tuple[str, ...]]:  # type: ignore[type-arg]
    out: list[tuple[str, ...]] = []
    names: dict[int, str] = {}
    for e in events:
        if isinstance(e, ReasoningDelta):
            out.append(("reasoning", e.text))
        elif isinstance(e, TextDelta):
            out.append(("text", e.text))
        elif isinstance(e, ToolCallStart):
            names[e.index] = e.name
        elif isinstance(e, ToolCallEnd):
            out.append(("call", names[e.index], e.arguments))
        else:
            assert isinstance(e, ToolCallArgsDelta)
    return out


@pytest.mark.parametrize("syntax", sorted(CALLS))
def test_call_inside_reasoning_is_reasoning_and_after_it_is_a_call(syntax: str) -> None:
    call, expected = CALLS[syntax]
    text = f"<think>\n{call}\n</think>\n\n{call}"
    events = assert_split_invariant(lambda: _segmenter(syntax), text)
    assert _compact(events) == [("reasoning", f"{call}\n"), *expected]


@pytest.mark.parametrize("syntax", sorted(CALLS))
def test_call_in_unterminated_reasoning_is_never_executed(syntax: str) -> None:
    call, _ = CALLS[syntax]
    events = assert_split_invariant(lambda: _segmenter(syntax), f"<think>{call}")
    assert _compact(events) == [("reasoning", call)]
    events = assert_split_invariant(lambda: _segmenter(syntax, inside=True), f"{call}</think>done")
    assert _compact(events) == [("reasoning", call), ("text", "done")]


@pytest.mark.parametrize("syntax", sorted(CALLS))
def test_without_tools_offered_markup_is_text(syntax: str) -> None:
    call, _ = CALLS[syntax]
    events = assert_split_invariant(lambda: _segmenter(syntax, tools=False), f"<think>x</think>{call}")
    assert _compact(events) == [("reasoning", "x"), ("text", call)]


def test_call_ids_are_assigned_once_and_sampled_markup_is_kept() -> None:
    segmenter = _segmenter("hermes")
    text = 'a <tool_call>{"name": "bash", "arguments": {}}</tool_call><tool_call>{"name": "read", "arguments": {}}</tool_call>'
    events = segmenter.feed(text) + segmenter.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id) for s in starts] == [(0, f"{0:032x}"), (1, f"{1:032x}")]
    assert segmenter.sampled_calls == {
        f"{0:032x}": ' <tool_call>{"name": "bash", "arguments": {}}</tool_call>',
        f"{1:032x}": '<tool_call>{"name": "read", "arguments": {}}</tool_call>',
    }


def test_default_ids_are_32_hex() -> None:
    segmenter = OutputSyntax("hermes", None).segmenter(REQUEST)
    (start,) = [
        e
        for e in segmenter.feed('<tool_call>{"name": "bash", "arguments": {}}</tool_call>')
        if isinstance(e, ToolCallStart)
    ]
    assert len(start.id) == 32 and int(start.id, 16) >= 0


DEEPSEEK_TEMPLATE = "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% if not thinking %}{{'</think>'}}{% else %}{{'<think>'}}{% endif %}{% endif %}<｜DSML｜invoke"


def test_output_syntax_from_template_and_the_seam() -> None:
    syntax = OutputSyntax.detect(DEEPSEEK_TEMPLATE)
    assert (
        syntax.tool_parser == "deepseek_dsml"
        and syntax.reasoning is not None
        and syntax.reasoning.opens_in_prompt
    )
    assert "deepseek_dsml" in syntax.describe()
    call = '<｜DSML｜tool_calls><｜DSML｜invoke name="bash"></｜DSML｜invoke></｜DSML｜tool_calls>'
    thinking = syntax.segmenter(REQUEST)  # thinking on by default: the prompt opened the block
    assert _compact(thinking.feed(f"plan {call}</think>ok") + thinking.finish()) == [
        ("reasoning", f"plan {call}"),
        ("text", "ok"),
    ]
    off = ChatRequest(messages=REQUEST.messages, tools=TOOLS, reasoning=ReasoningControl(enabled=False))
    plain = syntax.segmenter(off)  # thinking off: the template wrote `</think>`, output is content
    assert _compact(plain.feed(f"ok {call}") + plain.finish()) == [("text", "ok"), ("call", "bash", "{}")]
    none = ChatRequest(messages=REQUEST.messages, tools=TOOLS, tool_choice="none")
    assert _compact(syntax.segmenter(none).feed(f"</think>{call}")) == [("text", call)]


def test_tool_parser_override_is_validated() -> None:
    assert OutputSyntax.detect(None, tool_parser="glm").tool_parser == "glm"
    assert OutputSyntax.detect(None).tool_parser == "hermes"
    with pytest.raises(UnknownToolParserError):
        OutputSyntax.detect(None, tool_parser="nope")


class _CharDecoder:
    """Token id = code point: enough for the pipeline's detokenizer."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, token_ids))


@pytest.mark.parametrize(
    ("engine_reason", "output", "reason"),
    [
        (
            "stop",
            '<think>hm</think>ok <tool_call>{"name": "bash", "arguments": {}}</tool_call>',
            "tool_calls",
        ),
        ("stop", "<think>hm</think>just text", "stop"),
        ("length", '<think>hm</think><tool_call>{"name": "bash", "arguments": {"cmd": "l', "length"),
    ],
)
def test_plugs_into_the_output_pipeline(engine_reason: str, output: str, reason: str) -> None:
    """The seam ChatServiceSettings(segmenter_factory=...) feeds: token by token, then finish."""
    syntax = OutputSyntax.detect("<tool_call> </think>")
    pipeline = OutputPipeline(
        IncrementalDetokenizer(_CharDecoder()), StopMatcher(()), syntax.segmenter(REQUEST)
    )
    events = [e for ch in output for e in pipeline.push([ord(ch)]).events] + pipeline.finish()
    assert [type(e).__name__ for e in events][:1] == ["ReasoningDelta"]
    assert pipeline.finish_reason(engine_reason) == reason  # type: ignore[arg-type]
    assert any(isinstance(e, ToolCallStart) for e in events) == ("tool_call" in output)


def test_an_aborted_live_call_is_not_remembered_for_replay() -> None:
    """A block that went malformed after its call started streaming comes back as text; its markup is
    not the call's, so tool replay memory must not store it."""
    segmenter = _segmenter("hermes")
    text = '<tool_call>{"name": "bash", "arguments": {"cmd": oops}}</tool_call>'
    events = [e for ch in text for e in segmenter.feed(ch)] + segmenter.finish()
    assert any(isinstance(e, ToolCallEnd) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text
    assert segmenter.sampled_calls == {} and segmenter.sampled_blocks == []
