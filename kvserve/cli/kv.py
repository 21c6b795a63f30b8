"""`kvserve kv ls|show|prune|verify|rm`: inspect and edit a disk KV cache directory.

Read-only commands work beside a running server; the editing ones (rm, prune, verify --fix)
take the directory's lock and refuse while a server holds it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from rich.markup import escape
from rich.table import Table

from kvserve.cli import kv_format as fmt
from kvserve.kvstore.cache_dir import CacheDirBusyError, DirLock, default_cache_dir
from kvserve.kvstore.inventory import Inventory, InventoryEntry, remove_checkpoints, scan
from kvserve.kvstore.prune import PruneFilter, parse_duration, plan_prune
from kvserve.kvstore.verify import fix, verify

MIB = 1 << 20


class KVCommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kv-cache-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"cache directory (default {default_cache_dir()})",
    )
    p = sub.add_parser("kv", help="inspect and edit the disk KV cache")
    kv_sub = p.add_subparsers(dest="kv_command", required=True, metavar="KV_COMMAND")
    ls = kv_sub.add_parser("ls", parents=[common], help="list checkpoints with sizes, hits and totals")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=_guarded(_ls))
    show = kv_sub.add_parser("show", parents=[common], help="all metadata of one checkpoint")
    show.add_argument("checkpoint_id", metavar="ID", help="checkpoint id (a unique prefix will do)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_guarded(_show))
    prune = kv_sub.add_parser("prune", parents=[common], help="remove checkpoints by budget, age or model")
    prune.add_argument(
        "--budget-mb", type=float, metavar="N", help="evict by the server's policy until the cache fits N MiB"
    )
    prune.add_argument(
        "--older-than", type=parse_duration, metavar="DURATION", help="last used before (7d, 12h, 30m)"
    )
    prune.add_argument(
        "--model", metavar="FP", help="only checkpoints whose model fingerprint starts with FP"
    )
    prune.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    prune.set_defaults(func=_guarded(_prune))
    check = kv_sub.add_parser("verify", parents=[common], help="hash-verify every chunk and manifest")
    check.add_argument("--fix", action="store_true", help="remove what is bad and rebuild the index")
    check.set_defaults(func=_guarded(_verify))
    rm = kv_sub.add_parser("rm", parents=[common], help="remove checkpoints (and the chunks only they use)")
    rm.add_argument(
        "checkpoint_ids", nargs="*", metavar="ID", help="checkpoint ids (unique prefixes will do)"
    )
    rm.add_argument("--all", action="store_true", help="remove every checkpoint")
    rm.set_defaults(func=_guarded(_rm))


Command = Callable[[argparse.Namespace, Path], int]


def _guarded(command: Command) -> Callable[[argparse.Namespace], NoReturn]:
    """The command's edge: user mistakes and I/O errors become one line and exit status 1."""

    def run(args: argparse.Namespace) -> NoReturn:
        try:
            status = command(args, args.kv_cache_dir or default_cache_dir())
        except (KVCommandError, OSError) as error:
            _fail(str(error))
        sys.exit(status)

    return run


def _fail(message: str) -> NoReturn:
    print(f"kvserve kv: error: {message}", file=sys.stderr)
    sys.exit(1)


def _inventory(directory: Path) -> Inventory:
    if not directory.is_dir():
        raise KVCommandError(f"{directory} does not exist (no KV cache has been stored there)")
    try:
        return scan(directory)
    except FileNotFoundError as error:
        raise KVCommandError(f"{directory} is not a kvserve KV cache directory") from error


@contextmanager
def _editing(directory: Path, *, enabled: bool = True) -> Iterator[None]:
    """Hold the directory's exclusive lock while editing it (a missing directory errors later)."""
    if not enabled or not directory.is_dir():
        yield
        return
    try:
        lock = DirLock(directory, exclusive=True)
    except CacheDirBusyError as error:
        raise KVCommandError(f"{error}; stop it first (or use --dry-run / a read-only command)") from error
    try:
        yield
    finally:
        lock.release()


def _ls(args: argparse.Namespace, directory: Path) -> int:
    inventory = _inventory(directory)
    now = time.time()
    entries = sorted(inventory.entries, key=lambda e: e.checkpoint.meta.last_used, reverse=True)
    if args.json:
        document = {"directory": str(directory), "checkpoints": [fmt.record(e, now) for e in entries]}
        print(json.dumps(document | {"totals": fmt.totals(inventory)}, indent=2))
        return 0
    console = fmt.console()
    table = Table(
        "id", "reason", "tokens", "marginal", "total", "hits", "eff. hits", "created", "last used", "model"
    )
    for entry in entries:
        record = fmt.record(entry, now)
        table.add_row(
            entry.checkpoint_id[:12],
            record["reason"],
            f"{record['num_tokens']:,}",
            fmt.size(record["marginal_bytes"]),
            fmt.size(record["total_bytes"]),
            str(record["hits"]),
            f"{record['effective_hits']:.2f}",
            fmt.ago(record["created"], now),
            fmt.ago(record["last_used"], now),
            fmt.model(entry),
        )
    console.print(f"KV cache {escape(str(directory))}", highlight=False)
    if entries:
        console.print(table)
    totals = fmt.totals(inventory)
    console.print(
        f"{totals['num_checkpoints']} checkpoints, {fmt.size(totals['bytes_on_disk'])} on disk, "
        f"{totals['num_unique_chunks']} unique chunks, dedup {totals['dedup_ratio']:.2f}x "
        f"({fmt.size(totals['logical_bytes'])} without sharing)",
        highlight=False,
    )
    if inventory.unreadable:
        console.print(f"{len(inventory.unreadable)} unreadable manifests: run `kvserve kv verify`")
    return 0


def _resolve(inventory: Inventory, id_prefix: str) -> InventoryEntry:
    found = inventory.find(id_prefix)
    if not found:
        raise KVCommandError(f"no checkpoint {id_prefix!r} in {inventory.directory}")
    if len(found) > 1:
        ids = ", ".join(entry.checkpoint_id[:12] for entry in found[:5])
        raise KVCommandError(
            f"checkpoint id {id_prefix!r} is ambiguous: {ids}{', ...' if len(found) > 5 else ''}"
        )
    return found[0]


def _show(args: argparse.Namespace, directory: Path) -> int:
    inventory = _inventory(directory)
    entry = _resolve(inventory, args.checkpoint_id)
    now = time.time()
    record = fmt.record(entry, now)
    users = inventory.chunk_users()
    chunks = [
        {
            "key": s.key,
            "start": s.start,
            "end": s.end,
            "bytes": inventory.chunk_sizes.get(s.key),
            "users": users[s.key],
        }
        for s in entry.checkpoint.chunks
    ]
    if args.json:
        print(json.dumps(record | {"chunks": chunks}, indent=2))
        return 0
    console = fmt.console()
    table = Table("field", "value", show_header=False)
    for key, value in record.items():
        if key in ("created", "last_used"):
            value = f"{fmt.iso(value)} ({fmt.ago(value, now)})"
        elif key.endswith("_bytes") and key != "text_bytes":
            value = f"{fmt.size(value)} ({value:,} bytes)"
        elif key == "effective_hits":
            value = f"{value:.3f}"
        table.add_row(key, escape(str(value)))
    console.print(table)
    shared = sum(1 for c in chunks if c["users"] > 1)
    missing = sum(1 for c in chunks if c["bytes"] is None)
    console.print(
        f"{len(chunks)} chunks, {shared} shared with other checkpoints, {missing} missing", highlight=False
    )
    chunk_table = Table("#", "key", "tokens", "size", "used by")
    shown = chunks if len(chunks) <= 12 else chunks[:6] + chunks[-6:]
    for c in shown:
        size = "missing" if c["bytes"] is None else fmt.size(c["bytes"])
        position = chunks.index(c)
        chunk_table.add_row(str(position), c["key"][:16], f"{c['start']}-{c['end']}", size, str(c["users"]))
    console.print(chunk_table)
    if len(chunks) > len(shown):
        console.print(f"({len(chunks) - len(shown)} chunks in the middle not shown; --json lists all)")
    return 0


def _prune(args: argparse.Namespace, directory: Path) -> int:
    if args.budget_mb is None and args.older_than is None and args.model is None:
        raise KVCommandError("prune needs --budget-mb, --older-than or --model")
    if args.budget_mb is not None and args.budget_mb < 0:
        raise KVCommandError("--budget-mb must be >= 0")
    with _editing(directory, enabled=not args.dry_run):
        inventory = _inventory(directory)
        budget = None if args.budget_mb is None else int(args.budget_mb * MIB)
        plan = plan_prune(inventory, time.time(), budget, PruneFilter(args.older_than, args.model))
        if not plan.fits:
            raise KVCommandError(
                f"removing every matching checkpoint would still leave more than {args.budget_mb:g} MiB; "
                "nothing removed"
            )
        return _remove(inventory, plan.victim_ids, dry_run=args.dry_run)


def _rm(args: argparse.Namespace, directory: Path) -> int:
    if args.all == bool(args.checkpoint_ids):
        raise KVCommandError("give checkpoint ids or --all (not both)")
    with _editing(directory):
        inventory = _inventory(directory)
        if args.all:
            ids: Sequence[str] = [entry.checkpoint_id for entry in inventory.entries]
        else:  # every id resolved before anything is removed; duplicates once
            ids = list(dict.fromkeys(_resolve(inventory, p).checkpoint_id for p in args.checkpoint_ids))
        return _remove(inventory, ids, dry_run=False)


def _remove(inventory: Inventory, ids: Sequence[str], *, dry_run: bool) -> int:
    console = fmt.console()
    by_id = {entry.checkpoint_id: entry for entry in inventory.entries}
    verb = "would remove" if dry_run else "removed"
    for checkpoint_id in ids:
        entry = by_id[checkpoint_id]
        meta = entry.checkpoint.meta
        console.print(
            f"{verb} {checkpoint_id[:12]}  {meta.reason:<9} {meta.num_tokens:>8,} tokens  "
            f"frees {fmt.size(entry.marginal_bytes)}",
            highlight=False,
        )
    if dry_run:
        console.print(f"{len(ids)} checkpoints would be removed (dry run)")
        return 0
    removal = remove_checkpoints(inventory, ids)
    console.print(
        f"removed {removal.num_checkpoints} checkpoints and {removal.num_chunks} chunks, "
        f"freed {fmt.size(removal.num_bytes)}",
        highlight=False,
    )
    return 0


def _verify(args: argparse.Namespace, directory: Path) -> int:
    with _editing(directory, enabled=args.fix):
        inventory = _inventory(directory)
        report = verify(inventory)
        console = fmt.console()
        identity = report.identity
        model = "empty" if identity is None else f"model {identity.fingerprint} ({identity.dtype})"
        console.print(
            f"KV cache {escape(str(directory))}: {model}; {report.num_checkpoints_ok} checkpoints and "
            f"{report.num_chunks_ok} chunks verified",
            highlight=False,
        )
        if report.is_ok:
            console.print("[green]ok[/green]: no problems found")
            return 0
        table = Table("problem", "file", "why")
        for problem in report.problems:
            relative = problem.path.relative_to(directory)
            table.add_row(problem.kind, escape(str(relative)), escape(problem.why))
        console.print(table)
        if not args.fix:
            if _is_busy(directory):
                console.print(
                    "note: a server is using this directory; files it is writing may show as orphans"
                )
            console.print(f"{len(report.problems)} problems; run `kvserve kv verify --fix` to remove them")
            return 1
        fix(inventory, report)
        console.print(f"fixed: removed {len(report.problems)} bad files and rebuilt the index")
        return 0


def _is_busy(directory: Path) -> bool:
    try:
        DirLock(directory, exclusive=True).release()
    except CacheDirBusyError:
        return True
    except OSError:
        return False
    return False
