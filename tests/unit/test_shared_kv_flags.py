"""`kvserve serve`'s shared KV tier flags become KVStoreConfig.shared; a mistake stops the start
with a message naming the flag."""

from __future__ import annotations

import argparse

import pytest

from kvserve.cli.engine_args import add_kv_store_args, kv_store_config_from_args
from kvserve.config import SharedKVConfig


def _config(*argv: str):  # -> KVStoreConfig | None
    parser = argparse.ArgumentParser()
    add_kv_store_args(parser)
    return kv_store_config_from_args(parser.parse_args(list(argv)))


def test_the_flags_name_a_directory_or_a_bucket() -> None:
    assert _config("--kv-shared-dir", "/mnt/kv").shared == SharedKVConfig("/mnt/kv")
    config = _config("--kv-s3-url", "s3://bucket/prefix", "--kv-s3-endpoint", "http://127.0.0.1:8333")
    assert config.shared == SharedKVConfig("s3://bucket/prefix", "http://127.0.0.1:8333")
    assert _config().shared is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kv-s3-url", "bucket/prefix"], "s3://bucket/prefix"),
        (["--kv-s3-endpoint", "http://x"], "needs --kv-s3-url"),
        (["--no-kv-cache", "--kv-shared-dir", "/mnt/kv"], "drop --no-kv-cache"),
        (["--kv-cache-dir", "/tmp/kv", "--kv-shared-dir", "/tmp/kv/"], "must not be the --kv-cache-dir"),
    ],
)
def test_a_mistake_stops_the_start_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        _config(*argv)


def test_a_directory_and_a_bucket_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config("--kv-shared-dir", "/mnt/kv", "--kv-s3-url", "s3://b/p")
    assert "not allowed with argument" in capsys.readouterr().err
