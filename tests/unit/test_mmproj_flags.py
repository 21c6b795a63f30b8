"""`--mmproj` / `--no-mmproj` (llama-server's flag) on every engine command, onto EngineConfig.mmproj."""

from __future__ import annotations

import argparse

import pytest

from kvserve.cli.engine_args import add_engine_args, engine_config_from_args


def _mmproj(*argv: str) -> str:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(["--model", "m.gguf", *argv])).mmproj


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), "auto"),
        (("--mmproj", "mmproj-m.gguf"), "mmproj-m.gguf"),
        (("--mmproj", "none"), "none"),
        (("--no-mmproj",), "none"),
        (("--mmproj", "mmproj-m.gguf", "--no-mmproj"), "none"),
    ],
)
def test_mmproj_flags(argv: tuple[str, ...], expected: str) -> None:
    assert _mmproj(*argv) == expected
