"""write / edit: atomicity, the changed-since-read refusal, unique matches, confirmation."""

from __future__ import annotations

import os

from tests.unit.agent.conftest import Box


def test_write_creates_a_new_file_with_parents(box) -> None:
    out = box.ok("write", path="pkg/new.py", content="print(1)\n")
    assert out == "created pkg/new.py (9 bytes, 1 lines)"
    assert (box.root / "pkg" / "new.py").read_text() == "print(1)\n"
    assert box.questions == ["allow write pkg/new.py?"]


def test_overwrite_needs_a_read_first(box) -> None:
    (box.root / "a.txt").write_text("old\n")
    assert "you have not read it" in box.error("write", path="a.txt", content="new\n")
    box.ok("read", path="a.txt")
    assert box.ok("write", path="a.txt", content="new\n").startswith("overwrote a.txt")
    assert (box.root / "a.txt").read_text() == "new\n"
    # the agent's own write counts as having seen the file
    box.ok("write", path="a.txt", content="newer\n")


def test_write_refuses_when_the_file_changed_since_it_was_read(box) -> None:
    path = box.root / "a.txt"
    path.write_text("v1\n")
    box.ok("read", path="a.txt")
    path.write_text("v2 from someone else\n")
    assert "changed on disk since you last read it" in box.error("write", path="a.txt", content="mine\n")
    assert path.read_text() == "v2 from someone else\n"
    box.ok("read", path="a.txt")
    box.ok("write", path="a.txt", content="mine\n")


def test_write_is_atomic_and_keeps_the_mode(box) -> None:
    path = box.root / "run.sh"
    path.write_text("#!/bin/sh\n")
    os.chmod(path, 0o755)
    inode = path.stat().st_ino
    box.ok("read", path="run.sh")
    box.ok("write", path="run.sh", content="#!/bin/sh\necho hi\n")
    assert path.stat().st_mode & 0o777 == 0o755
    assert path.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert [p.name for p in box.root.iterdir()] == ["run.sh"]  # no temp file left behind


def test_denied_write_changes_nothing(tmp_path) -> None:
    box = Box(tmp_path, answer=False)
    outcome = box("write", path="a.txt", content="x")
    assert outcome.was_denied and "denied" in outcome.text
    assert not (tmp_path / "a.txt").exists()


def test_edit_replaces_one_unique_match(box) -> None:
    path = box.root / "m.py"
    path.write_text("a = 1\nb = 2\nc = 3\n")
    assert "first at line 2" in box.ok("edit", path="m.py", old="b = 2", new="b = 20")
    assert path.read_text() == "a = 1\nb = 20\nc = 3\n"


def test_edit_errors_for_zero_and_many_matches(box) -> None:
    path = box.root / "m.py"
    path.write_text("x = 1\nx = 1\ny  =  2\n")
    many = box.error("edit", path="m.py", old="x = 1", new="x = 2")
    assert "matches 2 times (at lines 1, 2)" in many and "more surrounding lines" in many
    assert "not found" in box.error("edit", path="m.py", old="z = 9", new="")
    assert "whitespace is ignored" in box.error("edit", path="m.py", old="y = 2", new="")
    assert path.read_text() == "x = 1\nx = 1\ny  =  2\n"
    assert "2 replacement(s)" in box.ok("edit", path="m.py", old="x = 1", new="x = 3", replace_all=True)
    assert path.read_text() == "x = 3\nx = 3\ny  =  2\n"


def test_edit_refuses_binary_and_missing_files(box) -> None:
    (box.root / "b.bin").write_bytes(b"\0\1\2")
    assert "binary" in box.error("edit", path="b.bin", old="a", new="b")
    assert "no such file" in box.error("edit", path="none.py", old="a", new="b")
    assert "'old' must not be empty" in box.error("edit", path="none.py", old="", new="b")


def test_bad_arguments_reach_the_model_as_errors(box) -> None:
    from kvserve.agent.messages import ToolCall

    outcome = box.toolbox.execute(ToolCall("c", "write", "{not json"))
    assert outcome.is_error and "not valid JSON" in outcome.text
    outcome = box.toolbox.execute(ToolCall("c", "frobnicate", "{}"))
    assert "unknown tool 'frobnicate'" in outcome.text
    assert "'content' must be a string" in box.error("write", path="a", content=5)
