"""`kvserve eval` model-free modes and its one-line errors, run in-process."""

from __future__ import annotations

import pytest

from kvserve.cli.main import main


def _exit(argv: list[str]) -> int | str | None:
    with pytest.raises(SystemExit) as raised:
        main(["--log-level", "WARNING", "eval", *argv])
    return raised.value.code


def test_self_test_extractors(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["--self-test-extractors"]) == 0
    assert "cases pass" in capsys.readouterr().out


def test_validate_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["--validate-cases"]) == 0
    assert "all 231 valid" in capsys.readouterr().out


def test_list_cases_with_filters(capsys: pytest.CaptureFixture[str]) -> None:
    main(["eval", "--list-cases", "--suite", "core,tools", "--domain", "units", "--case-id", "core/units-04"])
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:3] == ["core/units-04", "integer", "units"]
    main(["eval", "--list-cases", "--suite", "core,tools,humaneval", "--source", "kvserve-tools"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and all(line.startswith("tools/") for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--suite", "hard"], "unknown suite hard"),
        (["--suite", "core", "--domain", "astrology"], "no case matches"),
    ],
)
def test_bad_selections_exit_with_one_line(argv: list[str], message: str) -> None:
    code = _exit(argv)
    assert isinstance(code, str) and message in code


def test_an_unreachable_url_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["--url", "http://127.0.0.1:9", "--suite", "smoke", "--plain"]) == 2
    assert "kvserve eval: http://127.0.0.1:9" in capsys.readouterr().err
