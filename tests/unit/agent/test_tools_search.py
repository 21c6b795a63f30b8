"""search: regex and literal, glob, context, bounds, skipped files."""

from __future__ import annotations


def _tree(root) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("import os\ndef main():\n    return os.getcwd()\n")
    (root / "src" / "b.txt").write_text("main thing\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("main\n")
    (root / "bin.dat").write_bytes(b"main\0\0")


def test_regex_search_lists_path_line_text(box) -> None:
    _tree(box.root)
    out = box.ok("search", query=r"def \w+\(")
    assert out == "src/a.py:2:def main():"


def test_glob_literal_context_and_skips(box) -> None:
    _tree(box.root)
    out = box.ok("search", query="main", glob="*.py", context=1)
    assert out.splitlines() == [
        "src/a.py-1-import os",
        "src/a.py:2:def main():",
        "src/a.py-3-    return os.getcwd()",
    ]
    out = box.ok("search", query="main")
    assert ".git" not in out and "bin.dat" not in out and "src/b.txt:1:main thing" in out
    assert box.ok("search", query="os.getcwd()", mode="literal").startswith("src/a.py:3:")
    assert box.ok("search", query="MAIN", case_sensitive=False).count("main") == 2
    assert box.ok("search", query="zzz") == "no matches"


def test_results_are_bounded(box) -> None:
    (box.root / "many.txt").write_text("hit\n" * 1000)
    out = box.ok("search", query="hit", max_results=5)
    assert out.count("many.txt:") == 5 and out.endswith("[results truncated; narrow the search]")


def test_bad_regex_and_paths(box) -> None:
    assert "invalid regex" in box.error("search", query="(")
    assert "no such file" in box.error("search", query="x", path="nope")
    assert "outside" in box.error("search", query="x", path="/")
