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


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_max_tokens_limit_must_be_a_positive_integer(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--max-tokens-limit", value])
    assert exit_info.value.code == 2 and "--max-tokens-limit" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.5", "inf", "nan", "warm"])
def test_default_temperature_must_be_a_finite_non_negative_number(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--default-temperature", value])
    assert exit_info.value.code == 2 and "--default-temperature" in capsys.readouterr().err
