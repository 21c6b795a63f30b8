"""Sessions round-trip through JSON; names are validated; the last one is found."""

from __future__ import annotations

import os

import pytest

from kvserve.agent.messages import Message, ToolCall, Usage
from kvserve.agent.session import Session, SessionError, SessionStore


def test_save_and_load_round_trip(tmp_path) -> None:
    store = SessionStore(tmp_path / "sessions")
    messages = [
        Message("system", "s"),
        Message("user", "hi ✓"),
        Message("assistant", "", "thinking", (ToolCall("c1", "read", '{"path": "a"}'),)),
        Message("tool", "out", tool_call_id="c1", name="read"),
        Message("user", "note", is_internal=True),
    ]
    session = Session("work-1", messages, "/tmp", "m", Usage(10, 2, 8), 1)
    store.save(session)
    loaded = store.load("work-1")
    assert loaded == session


def test_names_and_last(tmp_path) -> None:
    store = SessionStore(tmp_path)
    assert store.last() is None
    store.save(Session("a"))
    store.save(Session("b"))
    os.utime(tmp_path / "a.json", (1, 1))
    assert store.names() == ["b", "a"] and store.last() == "b"
    with pytest.raises(SessionError, match="invalid session name"):
        store.save(Session("../escape"))
    with pytest.raises(SessionError, match="no session named 'zz'"):
        store.load("zz")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SessionError, match="unreadable"):
        store.load("bad")
