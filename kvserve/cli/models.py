"""`kvserve models`: the models kvserve knows, and which are installed."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list known and installed models")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvserve.models.aliases import list_known_models

    table = Table("alias", "installed", "size", "path / how to install")
    for m in list_known_models():
        size = f"{m.size_bytes / 2**20:.0f} MiB" if m.size_bytes else "-"
        table.add_row(m.name, "yes" if m.installed else "no", size, str(m.path or m.install_hint))
    Console().print(table)
