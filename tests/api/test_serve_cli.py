"""`kvserve serve` flags that fail before any model is loaded: one clear line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.chat.image_limits import DEFAULT_LIMITS
from kvserve.cli.main import _build_parser, main


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


@pytest.mark.parametrize("flag", ["--max-images-per-request", "--max-image-pixels"])
def test_image_limits_must_be_positive_integers(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", flag, "0"])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_image_limit_flags_default_to_the_settings() -> None:
    args = _build_parser().parse_args(["serve", "--max-image-pixels", "1000"])
    assert args.max_images_per_request == DEFAULT_LIMITS.max_images_per_request == 16
    assert args.max_image_pixels == 1000


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


@pytest.mark.parametrize("value", ["{", "[]", '{"temp": 1}', '{"top_p": 0}'])
def test_override_generation_config_must_be_known_parameters_in_range(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--override-generation-config", value])
    assert exit_info.value.code == 2 and "--override-generation-config" in capsys.readouterr().err


def test_sampling_defaults_from_the_flags(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    import argparse
    import logging

    from kvserve.cli.serve import add_serve_args, sampling_defaults_from_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6, "top_k": 20}')
    folder = ["--model", str(tmp_path)]
    with caplog.at_level(logging.INFO, logger="kvserve.cli.serve"):
        defaults = sampling_defaults_from_args(parser.parse_args(folder))
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.6, 20, 0.95)
    assert "temperature 0.6 (generation_config.json)" in caplog.text  # shown at start-up
    args = parser.parse_args(
        [*folder, "--override-generation-config", '{"top_k": 7}', "--default-temperature", "0"]
    )
    assert (sampling_defaults_from_args(args).temperature, sampling_defaults_from_args(args).top_k) == (0, 7)
    none = sampling_defaults_from_args(parser.parse_args([*folder, "--generation-config", "none"]))
    assert (none.temperature, none.top_k) == (1.0, 0)
