"""The CLI turns a missing, corrupt or unsupported model into one clear line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.cli.main import main


@pytest.mark.parametrize(
    "make_model,expected",
    [
        (lambda tmp: tmp / "missing.gguf", "no such file or directory"),
        (lambda tmp: _write(tmp / "random.gguf", b"\x00garbage" * 64), "not a GGUF file"),
        (lambda tmp: _mkdir(tmp / "folder"), "has no config.json"),
    ],
)
def test_bad_model_exits_with_a_one_line_error(tmp_path: Path, make_model, expected: str) -> None:
    model = make_model(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "-m", str(model), "-p", "hi", "--device", "cpu", "--dtype", "float32"])
    message = str(exit_info.value.code)
    assert message.startswith("kvserve: ") and expected in message and "\n" not in message


def test_weight_quant_needs_cpu_bf16_or_fp32() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "-m", "smollm2", "-p", "hi", "--dtype", "float16", "--weight-quant", "int4"])
    assert "--weight-quant needs" in str(exit_info.value.code)


def test_int8_prefill_needs_fp32_int4() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "generate",
                "-m",
                "smollm2",
                "-p",
                "hi",
                "--dtype",
                "float32",
                "--weight-quant",
                "none",
                "--int8-prefill",
            ]
        )
    assert "--int8-prefill needs --weight-quant int4" in str(exit_info.value.code)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
