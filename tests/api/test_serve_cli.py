"""`kvserve serve` flags that fail before any model is loaded: one clear line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.cli.main import main


def test_chdir_to_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--chdir", str(missing), "--model", "smollm2"])
    message = str(exit_info.value.code)
    assert message == f"kvserve: --chdir {missing}: No such file or directory"


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_max_body_mb_must_be_a_positive_integer(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--max-body-mb", value])
    assert exit_info.value.code == 2 and "--max-body-mb" in capsys.readouterr().err
