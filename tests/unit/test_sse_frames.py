"""A pre-serialized frame is byte for byte the frame `json.dumps` of the whole payload gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvserve.api.openai_chat.adapter import ChatStreamEncoder
from kvserve.api.openai_completions.adapter import CompletionStreamEncoder
from kvserve.api.sse import FrameTemplate, data_frame
from kvserve.serving.events import TextDelta


@given(st.text())
def test_template_frame_equals_the_full_dump(text: str) -> None:
    payload = {"id": "x", "choices": [{"delta": {"content": FrameTemplate.MARKER}, "n": None}], "é": 1}
    expected = data_frame({"id": "x", "choices": [{"delta": {"content": text}, "n": None}], "é": 1})
    assert FrameTemplate(payload).frame(text) == expected


@pytest.mark.parametrize(
    "encoder", [ChatStreamEncoder("c", "m", True), CompletionStreamEncoder("c", "m", True)]
)
def test_text_frames_are_the_encoders_chunks(encoder) -> None:  # type: ignore[no-untyped-def]
    (frame,) = encoder.encode(TextDelta('héllo "x"\n'))
    chunk = json.loads(frame.removeprefix("data: "))
    choice = chunk["choices"][0]
    text = choice["delta"]["content"] if "delta" in choice else choice["text"]
    assert text == 'héllo "x"\n' and choice["finish_reason"] is None and chunk["model"] == "m"
    expected = encoder._chunk({"content": text}) if "delta" in choice else encoder._chunk(text, None)
    assert frame == expected
