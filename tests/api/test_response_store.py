"""Response store: LRU bounds, SQLite persistence, and previous_response_id over HTTP."""

from __future__ import annotations

import stat
from pathlib import Path

import openai
import pytest

from kvserve.chat.conversation import Message, ReasoningPart, TextPart, ToolCallPart, ToolResultPart
from kvserve.serving.response_store import ResponseStore, StoredResponse
from tests.api.conftest import MODEL, Harness

CONVERSATION = (
    Message("user", (TextPart("hi"),)),
    Message("assistant", (ReasoningPart("r"), TextPart("hello"), ToolCallPart("call_1", "f", '{"a": 1}'))),
    Message("tool", (ToolResultPart("call_1", "out", is_error=True),)),
)


def _stored(i: int, pad: int = 0) -> StoredResponse:
    return StoredResponse({"id": f"resp_{i}", "pad": "x" * pad}, CONVERSATION)


def test_round_trip_and_lru_by_count() -> None:
    store = ResponseStore(max_responses=2)
    for i in range(3):
        store.save(f"resp_{i}", _stored(i))
    assert store.lookup("resp_0") is None
    assert store.lookup("resp_1") == _stored(1)
    store.save("resp_3", _stored(3))  # resp_1 was used last, so resp_2 goes
    assert store.lookup("resp_2") is None and store.lookup("resp_1") is not None and len(store) == 2


def test_lru_by_bytes_and_oversized_records() -> None:
    store = ResponseStore(max_bytes=3000)
    store.save("a", _stored(0, pad=1000))
    store.save("b", _stored(1, pad=1000))
    store.save("c", _stored(2, pad=1000))
    assert store.lookup("a") is None and store.lookup("c") is not None
    store.save("huge", _stored(3, pad=5000))
    assert store.lookup("huge") is None and store.lookup("c") is not None


def test_sqlite_persistence_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "data" / "responses.sqlite"
    store = ResponseStore(path)
    store.save("resp_1", _stored(1))
    store.save("resp_2", _stored(2))
    assert store.delete("resp_2") and not store.delete("resp_2")
    reopened = ResponseStore(path, max_responses=10)
    assert reopened.lookup("resp_1") == _stored(1) and reopened.lookup("resp_2") is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_front_ends_sharing_the_file_see_each_others_responses(tmp_path: Path) -> None:
    """`serve --api-servers`: each front end has its own store over the one file; a conversation's
    next turn may land on another front end."""
    path = tmp_path / "responses.sqlite"
    first, second = ResponseStore(path), ResponseStore(path)
    first.save("resp_1", _stored(1))
    assert second.lookup("resp_1") == _stored(1) and len(second) == 1
    assert second.lookup("resp_missing") is None
    assert second.delete("resp_1") and first.lookup("resp_1") is None and not first.delete("resp_1")


async def test_previous_response_id_continues_the_conversation(harness: Harness) -> None:
    first = await harness.openai.responses.create(model=MODEL, input="Hi", instructions="Be brief.")
    fetched = await harness.openai.responses.retrieve(first.id)
    assert fetched.output_text == "Hello there!"
    second = await harness.openai.responses.create(
        model=MODEL, input="And again?", previous_response_id=first.id, instructions="New rules."
    )
    prompt = harness.service.detokenize(harness.engine.requests[1][0])
    assert prompt.startswith(
        "<|im_start|>system\nNew rules.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello there!<|im_end|>\n<|im_start|>user\nAnd again?"
    )
    assert "Be brief." not in prompt
    assert second.previous_response_id == first.id


async def test_streamed_responses_are_stored_and_store_false_is_honoured(harness: Harness) -> None:
    frames = await harness.sse("/v1/responses", {"model": MODEL, "input": "Hi", "stream": True})
    response_id = frames[-1][1]["response"]["id"]
    assert (await harness.http.get(f"/v1/responses/{response_id}")).json()["status"] == "completed"
    unstored = await harness.openai.responses.create(model=MODEL, input="Hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        await harness.openai.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as info:
        await harness.openai.responses.create(model=MODEL, input="x", previous_response_id=unstored.id)
    assert info.value.code == "previous_response_not_found"


async def test_delete(harness: Harness) -> None:
    first = await harness.openai.responses.create(model=MODEL, input="Hi")
    deleted = await harness.http.delete(f"/v1/responses/{first.id}")
    assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    assert (await harness.http.delete(f"/v1/responses/{first.id}")).status_code == 404
