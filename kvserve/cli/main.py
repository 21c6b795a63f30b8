"""`kvserve` root command: serve | cluster | generate | chat | agent | eval | models | bench | kv."""

from __future__ import annotations

import argparse
import logging
import sys

from kvserve import __version__
from kvserve.env import EnvSwitchError, switches


def _build_parser() -> argparse.ArgumentParser:
    from kvserve.cli import agent, bench, chat, cluster, generate, kv, models, serve
    from kvserve.cli import eval as eval_cmd

    parser = argparse.ArgumentParser(prog="kvserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvserve {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (serve, cluster, generate, chat, agent, eval_cmd, models, bench, kv):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        switches()  # a mistyped KVSERVE_* variable stops every command here, before any work
    except EnvSwitchError as error:
        sys.exit(f"kvserve: {error}")
    try:
        args.func(args)
    except KeyboardInterrupt:
        sys.exit(130)
