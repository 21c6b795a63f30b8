"""`kvserve eval`'s embedded engine runs without a disk KV tier unless a directory is named."""

from __future__ import annotations

import argparse

from kvserve.cli import eval as eval_cli
from kvserve.cli.engine_args import kv_store_config_from_args


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    eval_cli.register(parser.add_subparsers())
    return parser.parse_args(["eval", *argv])


def test_no_disk_tier_by_default() -> None:
    args = _parse(["--suite", "smoke"])
    assert kv_store_config_from_args(args) is not None  # what `kvserve serve`'s defaults would give
    assert kv_store_config_from_args(eval_cli.embedded_args(args)) is None
    assert not args.no_kv_cache  # the caller's namespace is left as it was


def test_a_named_directory_keeps_the_disk_tier(tmp_path) -> None:
    args = _parse(["--suite", "smoke", "--kv-cache-dir", str(tmp_path)])
    config = kv_store_config_from_args(eval_cli.embedded_args(args))
    assert config is not None and config.directory == str(tmp_path)
