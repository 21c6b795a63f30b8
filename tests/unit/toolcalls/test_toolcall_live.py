"""Live argument streaming (ref §1.4 step 5, §1.6 step 5): a call starts once its name is known and its
arguments arrive while the model writes them, never showing a partial tag, escape or number."""

from __future__ import annotations

import json

import pytest
from split_points import assert_fragments_concatenate, run
from toolcall_cases import GOLDEN, TOOLS

from kvserve.toolcalls import CallArgs, CallEnd, CallStart, TextChunk, get_parser
from kvserve.toolcalls.live import closed_arguments

_D = "｜DSML｜"
LONG = "echo partial output of a rather long shell command && echo done"
# (syntax, the block up to its value, the rest of the block); the value is LONG.
LIVE = [
    ("hermes", '<tool_call>{"name": "bash", "arguments": {"cmd": "', '", "timeout": 5}}</tool_call>'),
    ("llama3_json", '<|python_tag|>{"name": "bash", "parameters": {"cmd": "', '", "timeout": 5}}'),
    (
        "qwen3_coder",
        "<tool_call>\n<function=bash>\n<parameter=cmd>\n",
        "\n</parameter>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>",
    ),
    (
        "glm",
        "<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>",
        "</arg_value>\n<arg_key>timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call>",
    ),
    (
        "deepseek_dsml",
        f'<{_D}tool_calls>\n<{_D}invoke name="bash">\n<{_D}parameter name="cmd" string="true">',
        (
            f'</{_D}parameter>\n<{_D}parameter name="timeout" string="false">5</{_D}parameter>\n'
            f"</{_D}invoke>\n</{_D}tool_calls>"
        ),
    ),
]
FINAL = json.dumps({"cmd": LONG, "timeout": 5}, separators=(",", ":"))


def _feed_chars(syntax: str, text: str):
    """Feed `text` one character at a time; yields (position, events of that character)."""
    parser = get_parser(syntax, TOOLS)
    for i, ch in enumerate(text):
        yield i, parser.feed(ch)
    yield len(text), parser.finish()


def _sent(events) -> str:
    return "".join(e.fragment for e in events if isinstance(e, CallArgs))


@pytest.mark.parametrize(("syntax", "head", "tail"), LIVE, ids=[c[0] for c in LIVE])
def test_a_long_argument_streams_before_the_block_closes(syntax: str, head: str, tail: str) -> None:
    text = head + LONG + tail
    before_close: list = []
    events: list = []
    for i, chunk in _feed_chars(syntax, text):
        events += chunk
        if i < len(head) + len(LONG):
            before_close += chunk
    assert isinstance(before_close[0], CallStart) and before_close[0].name == "bash"
    assert sum(isinstance(e, CallArgs) for e in before_close) >= 3  # several fragments, while sampled
    assert len(_sent(before_close)) > len(LONG) // 2
    assert FINAL.startswith(_sent(before_close))
    (end,) = [e for e in events if isinstance(e, CallEnd)]
    assert end.arguments == FINAL and _sent(events) == FINAL and not end.aborted
    assert [type(e) for e in events if not isinstance(e, CallArgs)] == [CallStart, CallEnd]


@pytest.mark.parametrize("syntax", sorted(GOLDEN))
def test_what_is_sent_is_always_a_prefix_of_the_final_arguments(syntax: str) -> None:
    """Char by char over every golden output: no held-back text (a partial closing tag, escape, entity,
    number, newline) is ever sent, since a sent fragment cannot be taken back."""
    for text, _ in GOLDEN[syntax]:
        events = [e for _, chunk in _feed_chars(syntax, text) for e in chunk]
        assert_fragments_concatenate(events)
        ends = {e.index: e.arguments for e in events if isinstance(e, CallEnd)}
        sent: dict[int, str] = {}
        for event in events:
            if isinstance(event, CallArgs):
                sent[event.index] = sent.get(event.index, "") + event.fragment
                assert ends[event.index].startswith(sent[event.index]), (text, sent[event.index])


def _streamed(syntax: str, text: str) -> str:
    """What was sent of the first call's arguments after feeding `text` char by char (no finish)."""
    parser = get_parser(syntax, TOOLS)
    events = [e for ch in text for e in parser.feed(ch)]
    return _sent(events)


@pytest.mark.parametrize(
    ("syntax", "text", "expected"),
    [
        # a partial closing tag is held, and so is the escaped closer `&lt;/｜DSML｜parameter>` until whole
        ("deepseek_dsml", LIVE[4][1] + "echo </", '{"cmd":"echo '),
        ("deepseek_dsml", LIVE[4][1] + "echo &lt;/｜DSML｜para", '{"cmd":"echo '),
        ("deepseek_dsml", LIVE[4][1] + f"echo &lt;/{_D}parameter> &", f'{{"cmd":"echo </{_D}parameter> '),
        # qwen3: the framing newline before `</parameter>` may be framing: held
        ("qwen3_coder", LIVE[2][1] + "ls -la\n</param", '{"cmd":"ls -la'),
        # a closer followed by nothing yet may still be part of the value
        ("qwen3_coder", LIVE[2][1] + "a</parameter>", '{"cmd":"a'),
        ("qwen3_coder", LIVE[2][1] + "a</parameter> x", '{"cmd":"a</parameter> x'),
        ("glm", LIVE[3][1] + "a</arg_val", '{"cmd":"a'),
        # JSON: a cut \\u escape and a lone high surrogate are held; escapes are re-written compactly
        ("hermes", LIVE[0][1] + "caf\\u00e", '{"cmd":"caf'),
        ("hermes", LIVE[0][1] + "caf\\u00e9 \\ud83d", '{"cmd":"café '),
        ("hermes", LIVE[0][1] + "caf\\u00e9 \\ud83d\\ude00\\/", '{"cmd":"café 😀/'),
        # a number is sent only once it ended; a typed XML value only once its tag closed
        ("hermes", '<tool_call>{"name": "bash", "arguments": {"timeout": 12', '{"timeout":'),
        ("hermes", '<tool_call>{"name": "bash", "arguments": {"timeout": 1.0e1,', '{"timeout":10.0,'),
        (
            "hermes",
            '<tool_call>{"name": "bash", "arguments": {"a": -0, "b": [1E2, 7, true]',
            '{"a":0,"b":[100.0,7,true]',
        ),
        ("qwen3_coder", "<function=bash>\n<parameter=timeout>\n30\n</parameter>", '{"timeout":'),
        ("qwen3_coder", "<function=bash>\n<parameter=timeout>\n30\n</parameter>\n<", '{"timeout":'),
        (
            "qwen3_coder",
            "<function=bash>\n<parameter=timeout>\n30\n</parameter>\n</function>",
            '{"timeout":30}',
        ),
        (
            "glm",
            "<tool_call>bash<arg_key>timeout</arg_key><arg_value>30</arg_value><arg_key>c",
            '{"timeout":30',
        ),
    ],
)
def test_uncertain_text_is_held(syntax: str, text: str, expected: str) -> None:
    assert _streamed(syntax, text) == expected


def test_no_call_starts_before_its_name_is_known() -> None:
    assert _streamed("hermes", '<tool_call>{"name": "ba') == ""
    parser = get_parser("glm", TOOLS)
    assert not [e for ch in "<tool_call>bash\n<arg_k" for e in parser.feed(ch)]


def test_later_calls_of_one_block_come_whole_after_the_first() -> None:
    """Calls of one block share its raw markup (known at close), and an API streams one call at a
    time: only a block's first call streams live, the others follow whole when the block closes."""
    text = (
        f'<{_D}tool_calls><{_D}invoke name="a"><{_D}parameter name="x" string="true">'
        + "one two three four five six"
        + f'</{_D}parameter></{_D}invoke><{_D}invoke name="b"><{_D}parameter name="y" string="true">z'
        + f"</{_D}parameter></{_D}invoke></{_D}tool_calls>"
    )
    events = run(lambda: get_parser("deepseek_dsml", TOOLS), list(text))
    kinds = [(type(e).__name__, e.index) for e in events if not isinstance(e, CallArgs)]
    assert kinds == [("CallStart", 0), ("CallEnd", 0), ("CallStart", 1), ("CallEnd", 1)]
    assert [e.arguments for e in events if isinstance(e, CallEnd)] == [
        '{"x":"one two three four five six"}',
        '{"y":"z"}',
    ]
    assert_fragments_concatenate(events)


@pytest.mark.parametrize(
    ("syntax", "text"),
    [
        ("hermes", '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"} oops</tool_call>'),
        (
            "glm",
            "<tool_call>bash<arg_key>cmd</arg_key><arg_value>ls</arg_value><arg_key>x</arg_key>junk</tool_call>",
        ),
        ("qwen3_coder", "<tool_call><function=bash><parameter=cmd>ls</parameter></function>junk</tool_call>"),
        (
            "deepseek_dsml",
            f'<{_D}tool_calls><{_D}invoke name="bash"><{_D}parameter name="cmd" string="true">ls</{_D}parameter>junk</{_D}invoke></{_D}tool_calls>',
        ),
    ],
)
def test_a_block_malformed_after_its_call_started_is_aborted_and_kept_as_text(syntax: str, text: str) -> None:
    """The call cannot be taken back: it ends with what was sent closed into valid JSON, marked
    aborted, and the block follows as text like any malformed block (nothing lost, never a raise)."""
    whole = run(lambda: get_parser(syntax, TOOLS), [text])
    assert whole == [TextChunk(text)]  # seen whole: plain text, as before
    events = run(lambda: get_parser(syntax, TOOLS), list(text))
    (end,) = [e for e in events if isinstance(e, CallEnd)]
    assert end.aborted and json.loads(end.arguments) == {"cmd": "ls"}
    assert_fragments_concatenate(events)
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == text


@pytest.mark.parametrize(
    ("sent", "closed"),
    [
        ("{", "{}"),
        ('{"a":', '{"a":null}'),
        ('{"a":"x', '{"a":"x"}'),
        ('{"a":1,', '{"a":1,"":null}'),
        ('{"a":[1,', '{"a":[1,null]}'),
        ('{"a":{"b"', '{"a":{"b":null}}'),
    ],
)
def test_an_aborted_call_closes_what_was_sent(sent: str, closed: str) -> None:
    assert closed_arguments(sent) == closed


def test_an_aborted_json_call_cut_after_a_comma_still_concatenates() -> None:
    text = '<tool_call>{"name": "bash", "arguments": {"timeout": 1, "cmd": oops}}</tool_call>'
    events = run(lambda: get_parser("hermes", TOOLS), list(text))
    (end,) = [e for e in events if isinstance(e, CallEnd)]
    assert end.aborted and end.arguments == '{"timeout":1,"cmd":null}'
    assert_fragments_concatenate(events)
