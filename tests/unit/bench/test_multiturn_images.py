"""`bench multiturn --image-turns`: screenshots in each API's own shape, text-only bodies unchanged,
the flags, and image turns marked in the report."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from rich.console import Console

from kvserve.bench import report
from kvserve.bench.client import Api, InlineImage, request_body
from kvserve.bench.metrics import RequestResult
from kvserve.bench.multiturn import AgentSession, TurnResult, summarize_turns, turn_screenshot
from kvserve.cli.main import _build_parser
from tests.unit.bench.char_tokenizer import CharTokenizer

IMAGE = InlineImage("image/png", "iVBORw0KGgo=")
MESSAGES = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": [IMAGE, "look"]},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "next"},
]


def test_chat_body_carries_an_image_url_part_before_the_text() -> None:
    body = request_body(Api.CHAT, MESSAGES, 8)
    assert body["messages"][1]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "look"},
    ]
    assert body["messages"][0] == MESSAGES[0] and body["messages"][2:] == MESSAGES[2:]


def test_anthropic_body_carries_a_base64_image_block() -> None:
    body = request_body(Api.ANTHROPIC, MESSAGES, 8)
    assert body["system"] == "sys"
    assert body["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "look"},
    ]
    assert body["messages"][1:] == MESSAGES[2:]


@pytest.mark.parametrize("api", [Api.CHAT, Api.ANTHROPIC])
def test_text_only_bodies_are_unchanged(api: Api) -> None:
    text_only = [MESSAGES[0], {"role": "user", "content": "look"}]
    body = request_body(api, text_only, 8, model="m")
    expected = {"max_tokens": 8, "temperature": 0.0, "stream": True, "model": "m"}
    if api is Api.CHAT:
        expected |= {"messages": text_only, "stream_options": {"include_usage": True}}
    else:
        expected |= {"messages": text_only[1:], "system": "sys"}
    assert body == expected


def test_screenshots_are_deterministic_per_seed_agent_and_turn() -> None:
    first = turn_screenshot(0, 1, 3, (320, 200))
    assert first == turn_screenshot(0, 1, 3, (320, 200))
    others = {turn_screenshot(*key, (320, 200)).data for key in [(1, 1, 3), (0, 2, 3), (0, 1, 1)]}
    assert first.data not in others and len(others) == 3
    image = Image.open(io.BytesIO(base64.b64decode(first.data)))
    assert image.format == "PNG" and image.size == (320, 200)


def test_prompt_len_estimate_counts_text_parts_only() -> None:
    session = AgentSession(0, "sys")
    session.messages += MESSAGES[1:]
    assert session.prompt_len_estimate(CharTokenizer()) == len("sys" + "look" + "ok" + "next")


def test_image_flags_parse() -> None:
    parser = _build_parser()
    plain = parser.parse_args(["bench", "multiturn"])
    assert plain.image_turns == () and plain.image_size == (1920, 1080)
    args = parser.parse_args(["bench", "multiturn", "--image-turns", "3,1", "--image-size", "640x360"])
    assert args.image_turns == (1, 3) and args.image_size == (640, 360)
    for bad in (["--image-turns", "0"], ["--image-turns", "a"], ["--image-size", "640"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", "multiturn", *bad])


def test_report_marks_image_turns() -> None:
    results = [
        TurnResult(0, turn, False, RequestResult(True, 100, 10, ttft=0.1, latency=1.0), int(turn in (1, 3)))
        for turn in (1, 2, 3)
    ]
    assert [s.has_image for s in summarize_turns(results)] == [True, False, True]
    console = Console(record=True, width=200)
    console.print(report.multiturn_table({"kvserve": summarize_turns(results)}, "mt"))
    lines = console.export_text().splitlines()
    assert any("1 (image)" in line for line in lines) and any("3 (image)" in line for line in lines)
    assert not any("2 (image)" in line for line in lines)
    assert [row["images"] for row in report.multiturn_rows("kvserve", results)] == [1, 0, 1]
