"""read / more / list: ranges, continuation, bounds, binary and missing files, confinement."""

from __future__ import annotations

import os

from kvserve.agent.tools.files import MAX_READ_BYTES


def _numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def test_read_shows_a_line_range_with_numbers(box) -> None:
    (box.root / "a.txt").write_text(_numbered(10))
    out = box.ok("read", path="a.txt", start_line=3, max_lines=2)
    assert out.splitlines()[0] == "a.txt: lines 3-4"
    assert "     3\tline 3" in out and "     4\tline 4" in out and "\tline 5" not in out
    assert "call more" in out


def test_more_continues_exactly_where_read_stopped(box) -> None:
    (box.root / "a.txt").write_text(_numbered(10))
    box.ok("read", path="a.txt", max_lines=4)
    out = box.ok("more", count=3)
    assert out.splitlines()[1:4] == ["     5\tline 5", "     6\tline 6", "     7\tline 7"]
    out = box.ok("more")
    assert "line 8" in out and "line 10" in out and out.endswith("[end of file]")
    assert "nothing to continue" in box.error("more")


def test_whole_small_file_ends_with_end_of_file(box) -> None:
    (box.root / "a.txt").write_text("only\n")
    out = box.ok("read", path="a.txt")
    assert out.endswith("[end of file]") and "more" not in out.splitlines()[-1]
    assert "end of file" in box.ok("read", path="a.txt", start_line=5)


def test_huge_file_is_read_in_bounded_pieces(box) -> None:
    line = "x" * 99 + "\n"
    with open(box.root / "big.txt", "w") as f:
        f.write(line * 200_000)  # 20 MB
    out = box.ok("read", path="big.txt", max_lines=2000)
    assert len(out) < MAX_READ_BYTES + 4096
    shown = [ln for ln in out.splitlines() if "\t" in ln]
    last = int(shown[-1].split("\t")[0])
    assert 100 < last < 2000
    assert f"from line {last + 1}" in out
    assert box.ok("more", count=1).splitlines()[1].startswith(f"{last + 1:6}\t")


def test_very_long_lines_are_cut(box) -> None:
    (box.root / "long.txt").write_text("y" * 50_000 + "\nnext\n")
    out = box.ok("read", path="long.txt")
    assert "line truncated, 50000 chars" in out and "next" in out and len(out) < 3000


def test_binary_missing_and_directory_are_clear_errors(box) -> None:
    (box.root / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 10)
    assert "binary file (70 bytes)" in box.error("read", path="blob.bin")
    assert "no such file" in box.error("read", path="nope.txt")
    (box.root / "d").mkdir()
    assert "is a directory" in box.error("read", path="d")
    assert "missing required argument 'path'" in box.error("read")
    assert "'max_lines' must be between" in box.error("read", path="d", max_lines=0)


def test_invalid_utf8_is_shown_with_replacement_characters(box) -> None:
    (box.root / "latin.txt").write_bytes("café\n".encode("latin-1"))
    assert "caf\ufffd" in box.ok("read", path="latin.txt")


def test_list_marks_directories_and_is_bounded(box) -> None:
    (box.root / "sub").mkdir()
    (box.root / "f.txt").write_text("abc")
    out = box.ok("list")
    assert "sub/" in out and "f.txt  (3 bytes)" in out
    for i in range(310):
        (box.root / "sub" / f"n{i:03}").touch()
    out = box.ok("list", path="sub")
    assert "n299" in out and "n300" not in out and "10 more entries not shown" in out
    assert "not a directory" in box.error("list", path="f.txt")
    assert "no such file" in box.error("list", path="ghost")


def test_paths_outside_the_working_directory_are_refused(box, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    for path in ("../secret.txt", str(secret), "sub/../../secret.txt"):
        assert "outside the working directory" in box.error("read", path=path)
    os.symlink(secret, box.root / "link.txt")
    assert "outside the working directory" in box.error("read", path="link.txt")
    assert "outside the working directory" in box.error("list", path="..")
    assert "outside the working directory" in box.error("write", path="../evil.txt", content="x")
    assert not (tmp_path / "evil.txt").exists()


def test_allowed_paths_open_the_confinement(tmp_path) -> None:
    from tests.unit.agent.conftest import Box

    (tmp_path / "work").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.txt").write_text("hi\n")
    box = Box(tmp_path / "work", allowed=(str(tmp_path / "shared"),))
    assert "hi" in box.ok("read", path=str(tmp_path / "shared" / "x.txt"))
    assert "outside" in box.error("read", path=str(tmp_path / "x.txt"))
