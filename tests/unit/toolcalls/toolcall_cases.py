"""Golden inputs per tool-call syntax: (input, expected) with expected as compact tuples:
("text", str) for visible text, ("call", name, arguments_json) for a call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvserve.toolcalls import CallArgs, CallEnd, CallStart, TextChunk


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


TOOLS = (
    Tool(
        "bash", {"type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}}}
    ),
    Tool(
        "write",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "opts": {"type": "object"},
                "force": {"type": "boolean"},
                "ratio": {"type": ["number", "null"]},
            },
        },
    ),
)


def compact(events: list[Any]) -> list[tuple[str, ...]]:
    """Merged events -> compact tuples, checking each call's event order and fragment concatenation."""
    out: list[tuple[str, ...]] = []
    open_call: tuple[int, str, str] | None = None
    next_index = 0
    for event in events:
        if isinstance(event, TextChunk):
            assert open_call is None, "text inside a call"
            out.append(("text", event.text))
        elif isinstance(event, CallStart):
            assert open_call is None and event.index == next_index
            open_call = (event.index, event.name, "")
        elif isinstance(event, CallArgs):
            assert open_call is not None and open_call[0] == event.index
            open_call = (open_call[0], open_call[1], open_call[2] + event.fragment)
        else:
            assert isinstance(event, CallEnd) and open_call is not None and open_call[0] == event.index
            assert open_call[2] == event.arguments, "fragments must concatenate to the final arguments"
            out.append(("call", open_call[1], event.arguments))
            open_call, next_index = None, next_index + 1
    assert open_call is None
    return out


HERMES = [
    ("Hello, world.\n", [("text", "Hello, world.\n")]),
    (
        'Let me look.\n\n<tool_call>\n{"name": "read", "arguments": {"path": "src/main.py"}}\n</tool_call>',
        [("text", "Let me look."), ("call", "read", '{"path":"src/main.py"}')],
    ),
    (  # nested JSON, escaped quotes, emoji written raw and as a surrogate pair
        (
            '<tool_call>{"name": "write", "arguments": {"content": "say \\"hi\\" 😀 \\ud83d\\ude00", '
            '"opts": {"a": [1, {"b": null}]}}}</tool_call>'
        ),
        [("call", "write", '{"content":"say \\"hi\\" 😀 😀","opts":{"a":[1,{"b":null}]}}')],
    ),
    (  # the closing marker inside a string value
        '<tool_call>{"name": "echo", "arguments": {"s": "a</tool_call>b"}}</tool_call>',
        [("call", "echo", '{"s":"a</tool_call>b"}')],
    ),
    (
        '<tool_call>{"name":"a","arguments":{}}</tool_call>\n<tool_call>{"name":"b","arguments":{"x":1}}</tool_call>\n',
        [("call", "a", "{}"), ("call", "b", '{"x":1}')],
    ),
    (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n\nDone.',
        [("call", "a", "{}"), ("text", "Done.")],
    ),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', [("call", "f", '{"a":1}')]),
    ('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>', [("call", "f", '{"a":1}')]),
    # malformed, terminated: the text as sampled
    ("x <tool_call>not json</tool_call> y", [("text", "x <tool_call>not json</tool_call> y")]),
    ('<tool_call>{"arguments": {}}</tool_call>', [("text", '<tool_call>{"arguments": {}}</tool_call>')]),
    ("<tool_call></tool_call>", [("text", "<tool_call></tool_call>")]),
    # truncated: repaired when the JSON can be closed, else text
    ('<tool_call>{"name": "read", "arguments": {"path": "/tm', [("call", "read", '{"path":"/tm"}')]),
    ('<tool_call>\n{"name": "read", "arguments": {"a": [1, 2</tool_ca', [("call", "read", '{"a":[1,2]}')]),
    ('ok <tool_call>{"na', [("text", 'ok <tool_call>{"na')]),
    # marker-like text is held back, then released
    ("if a <tool and b < c <tool_cal", [("text", "if a <tool and b < c <tool_cal")]),
    ("trailing space  ", [("text", "trailing space  ")]),
]

QWEN3_CODER = [
    (
        (
            "I will run it.\n<tool_call>\n<function=bash>\n<parameter=cmd>\nls -la\n</parameter>\n"
            "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
        ),
        [("text", "I will run it."), ("call", "bash", '{"cmd":"ls -la","timeout":30}')],
    ),
    (  # `</parameter>` inside a value: it only closes where the next tag follows
        (
            "<tool_call>\n<function=write>\n<parameter=content>\n<a></parameter>b\n</parameter>\n"
            "<parameter=path>\nx.xml\n</parameter>\n</function>\n</tool_call>"
        ),
        [("call", "write", '{"content":"<a></parameter>b","path":"x.xml"}')],
    ),
    (  # schema typing: object, boolean, number-or-null, unknown parameter as string, emoji
        (
            '<tool_call>\n<function=write>\n<parameter=opts>\n{"a": [1, 2]}\n</parameter>\n'
            "<parameter=force>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
            "<parameter=extra>\n42\n</parameter>\n<parameter=content>\n😀 multi\nline\n\n</parameter>\n"
            "</function>\n</tool_call>"
        ),
        [
            (
                "call",
                "write",
                '{"opts":{"a":[1,2]},"force":true,"ratio":0.5,"extra":"42","content":"😀 multi\\nline\\n"}',
            )
        ],
    ),
    (  # a value that is not of its declared type stays a string
        "<tool_call>\n<function=bash>\n<parameter=timeout>\nsoon\n</parameter>\n</function>\n</tool_call>",
        [("call", "bash", '{"timeout":"soon"}')],
    ),
    (  # the wrapper dropped
        "Sure.\n<function=bash>\n<parameter=cmd>\npwd\n</parameter>\n</function>",
        [("text", "Sure."), ("call", "bash", '{"cmd":"pwd"}')],
    ),
    (
        (
            "<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n"
            "<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
        ),
        [("call", "a", "{}"), ("call", "b", '{"x":"1"}')],
    ),
    (  # `</tool_call>` inside a value
        "<tool_call>\n<function=bash>\n<parameter=cmd>\necho '</tool_call>'\n</parameter>\n</function>\n</tool_call>",
        [("call", "bash", '{"cmd":"echo \'</tool_call>\'"}')],
    ),
    ("<tool_call>\nnot a function\n</tool_call>", [("text", "<tool_call>\nnot a function\n</tool_call>")]),
    (
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        [("text", "<tool_call>\n<function=>\n</function>\n</tool_call>")],
    ),
    # truncated
    (
        "<tool_call>\n<function=write>\n<parameter=path>\n/tmp/a\n</parameter>\n<parameter=content>\nhello wor",
        [("call", "write", '{"path":"/tmp/a","content":"hello wor"}')],
    ),
    (
        "<tool_call>\n<function=write>\n<parameter=path>\n/tmp/a\n</param",
        [("call", "write", '{"path":"/tmp/a"}')],
    ),
    ("<tool_call>\n<function=write>\n<parameter=pa", [("call", "write", "{}")]),
    ("Hm <tool_call>\n<function=wri", [("text", "Hm <tool_call>\n<function=wri")]),
]

GLM = [
    (
        (
            "Checking.<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n"
            "<arg_key>timeout</arg_key>\n<arg_value>10</arg_value>\n</tool_call>"
        ),
        [("text", "Checking."), ("call", "bash", '{"cmd":"ls","timeout":10}')],
    ),
    (  # GLM-4.7: no newlines
        (
            '<tool_call>write<arg_key>opts</arg_key><arg_value>{"k": [true]}</arg_value>'
            '<arg_key>content</arg_key><arg_value>a & <b> "q" 😀</arg_value></tool_call>'
        ),
        [("call", "write", '{"opts":{"k":[true]},"content":"a & <b> \\"q\\" 😀"}')],
    ),
    (  # `</arg_value>` inside a value
        "<tool_call>write<arg_key>content</arg_key><arg_value>x</arg_value>y</arg_value></tool_call>",
        [("call", "write", '{"content":"x</arg_value>y"}')],
    ),
    ("<tool_call>get_time</tool_call>", [("call", "get_time", "{}")]),
    ("<tool_call>\n</tool_call>", [("text", "<tool_call>\n</tool_call>")]),
    (
        "<tool_call>f<arg_key>k</arg_key>oops</tool_call>",
        [("text", "<tool_call>f<arg_key>k</arg_key>oops</tool_call>")],
    ),
    ("<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls -l", [("call", "bash", '{"cmd":"ls -l"}')]),
    ("<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_val", [("call", "bash", '{"cmd":"ls"}')]),
]

_D = "｜DSML｜"
DSML = [
    (
        (
            f'Reading.\n\n<{_D}tool_calls>\n<{_D}invoke name="bash">\n'
            f'<{_D}parameter name="cmd" string="true">a && b > c <d></{_D}parameter>\n'
            f'<{_D}parameter name="timeout" string="false">5</{_D}parameter>\n</{_D}invoke>\n</{_D}tool_calls>'
        ),
        [("text", "Reading."), ("call", "bash", '{"cmd":"a && b > c <d>","timeout":5}')],
    ),
    (  # the one escape: the closing parameter tag; other entities are text
        (
            f'<{_D}tool_calls><{_D}invoke name="write"><{_D}parameter name="content" string="true">'
            f"x &lt;/{_D}parameter> &amp; &lt;</{_D}parameter></{_D}invoke></{_D}tool_calls>"
        ),
        [("call", "write", f'{{"content":"x </{_D}parameter> &amp; &lt;"}}')],
    ),
    (  # attribute values are entity-escaped; `string` defaults to true
        (
            f'<{_D}tool_calls><{_D}invoke name="a&amp;b"><{_D}parameter name="q&quot;">1</{_D}parameter>'
            f"</{_D}invoke></{_D}tool_calls>"
        ),
        [("call", "a&b", '{"q\\"":"1"}')],
    ),
    (  # nested loose parameters, two invokes in one block, non-string JSON values
        (
            f'<{_D}tool_calls>\n<{_D}invoke name="f">\n<{_D}parameter name="o">\n'
            f'<{_D}parameter name="k" string="false">[1, {{"z": null}}]</{_D}parameter>\n'
            f'<{_D}parameter name="inner">\n<{_D}parameter name="s" string="true">deep</{_D}parameter>\n'
            f"</{_D}parameter>\n</{_D}parameter>\n</{_D}invoke>\n"
            f'<{_D}invoke name="g">\n</{_D}invoke>\n</{_D}tool_calls>'
        ),
        [("call", "f", '{"o":{"k":[1,{"z":null}],"inner":{"s":"deep"}}}'), ("call", "g", "{}")],
    ),
    (  # short variant
        (
            '<DSML｜tool_calls>\n<DSML｜invoke name="f">\n<DSML｜parameter name="x" string="false">true'
            "</DSML｜parameter>\n</DSML｜invoke>\n</DSML｜tool_calls>"
        ),
        [("call", "f", '{"x":true}')],
    ),
    (  # plain variant
        '<tool_calls><invoke name="f"><parameter name="x" string="true">1</parameter></invoke></tool_calls>',
        [("call", "f", '{"x":"1"}')],
    ),
    (  # non-string value that is not JSON: kept as the model's text
        (
            f'<{_D}tool_calls><{_D}invoke name="f"><{_D}parameter name="n" string="false">12abc</{_D}parameter>'
            f"</{_D}invoke></{_D}tool_calls>"
        ),
        [("call", "f", '{"n":"12abc"}')],
    ),
    (  # the block's end marker inside a string value
        (
            f'<{_D}tool_calls><{_D}invoke name="f"><{_D}parameter name="s" string="true">'
            f"</{_D}tool_calls></{_D}parameter></{_D}invoke></{_D}tool_calls>"
        ),
        [("call", "f", f'{{"s":"</{_D}tool_calls>"}}')],
    ),
    (  # text around the block passes through
        f'a <{_D}tool_calls><{_D}invoke name="f"></{_D}invoke></{_D}tool_calls> b',
        [("text", "a"), ("call", "f", "{}"), ("text", "b")],
    ),
    # malformed: text between elements, missing name
    (
        f'<{_D}tool_calls>oops<{_D}invoke name="f"></{_D}invoke></{_D}tool_calls>',
        [("text", f'<{_D}tool_calls>oops<{_D}invoke name="f"></{_D}invoke></{_D}tool_calls>')],
    ),
    (
        f"<{_D}tool_calls><{_D}invoke></{_D}invoke></{_D}tool_calls>",
        [("text", f"<{_D}tool_calls><{_D}invoke></{_D}invoke></{_D}tool_calls>")],
    ),
    # truncated: open tags closed in reverse order; a cut header drops its element
    (
        f'<{_D}tool_calls>\n<{_D}invoke name="bash">\n<{_D}parameter name="cmd" string="true">ls -la</{_D}para',
        [("call", "bash", '{"cmd":"ls -la"}')],
    ),
    (
        f'<{_D}tool_calls>\n<{_D}invoke name="f">\n<{_D}parameter name="o" string="false">{{"a": [1, "x',
        [("call", "f", '{"o":{"a":[1,"x"]}}')],
    ),
    (
        f'<{_D}tool_calls>\n<{_D}invoke name="f">\n<{_D}parameter name="a" string="true">1</{_D}parameter>\n<{_D}param',
        [("call", "f", '{"a":"1"}')],
    ),
    (f'<{_D}tool_calls>\n<{_D}invoke name="rea', [("text", f'<{_D}tool_calls>\n<{_D}invoke name="rea')]),
]

LLAMA3_JSON = [
    ('{"name": "f", "parameters": {"a": 1}}', [("call", "f", '{"a":1}')]),
    ('<|python_tag|>{"name": "f", "parameters": {"s": "😀"}}', [("call", "f", '{"s":"😀"}')]),
    (
        '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": [1]}}',
        [("call", "f", "{}"), ("call", "g", '{"x":[1]}')],
    ),
    ('Sure: {"name": "f", "parameters": {}}', [("text", "Sure:"), ("call", "f", "{}")]),
    ('{"name": "f", oops', [("text", '{"name": "f", oops')]),
    (
        '{"name": "f", "parameters": {}} and then text',
        [("text", '{"name": "f", "parameters": {}} and then text')],
    ),
    ("Just text {not a call}", [("text", "Just text {not a call}")]),
]

GOLDEN = {
    "hermes": HERMES,
    "qwen3_coder": QWEN3_CODER,
    "glm": GLM,
    "deepseek_dsml": DSML,
    "llama3_json": LLAMA3_JSON,
}
