"""`kvserve kv ls|show|prune|verify|rm`: inspect and edit a disk KV cache directory, over
every model's subdirectory of it.

Read-only commands work beside a running server; the editing ones (rm, prune, verify --fix)
take the directory's lock and refuse while a server holds it (and first move an old
flat-layout cache into its model subdirectory, as a server would).

With `--kv-shared-dir` or `--kv-s3-url` every command works on the tier shared by replicas instead,
while they run: it has no lock, and the editing commands delete nothing younger than `--grace`
(kvstore/shared/sweep.py says why that is safe).

The inventory, layout and verify modules (numpy, SQLite; verify's chunk reads import torch) are
imported by the commands when they run, so building the parser (`kvserve --help`) does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.markup import escape
from rich.table import Table

from kvserve.cli import kv_format as fmt
from kvserve.cli.engine_args import add_shared_kv_args, shared_kv_location
from kvserve.kvstore.cache_dir import CacheDirBusyError, DirLock, default_cache_dir
from kvserve.kvstore.prune import PruneFilter, Victim, parse_duration, plan_prune

if TYPE_CHECKING:
    from kvserve.kvstore.inventory import Inventory
    from kvserve.kvstore.shared.inventory import SharedScan
    from kvserve.kvstore.shared.object_store import ObjectStore
    from kvserve.kvstore.verify import Problem, VerifyReport

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
    add_shared_kv_args(common.add_argument_group("shared KV tier (instead of the cache directory)"))
    grace = argparse.ArgumentParser(add_help=False)
    grace.add_argument(
        "--grace",
        type=parse_duration,
        default=3600.0,
        metavar="DURATION",
        help="shared tier only: never delete an object younger than this (default 1h)",
    )
    p = sub.add_parser("kv", help="inspect and edit the disk KV cache")
    kv_sub = p.add_subparsers(dest="kv_command", required=True, metavar="KV_COMMAND")
    ls = kv_sub.add_parser("ls", parents=[common], help="list checkpoints with sizes, hits and totals")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=_guarded(_ls, _shared_ls))
    show = kv_sub.add_parser("show", parents=[common], help="all metadata of one checkpoint")
    show.add_argument("checkpoint_id", metavar="ID", help="checkpoint id (a unique prefix will do)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--model", metavar="FP", help="only look among models whose fingerprint starts with FP")
    show.set_defaults(func=_guarded(_show, _shared_show))
    prune = kv_sub.add_parser(
        "prune", parents=[common, grace], help="remove checkpoints by budget, age or model"
    )
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
    prune.set_defaults(func=_guarded(_prune, _shared_prune))
    check = kv_sub.add_parser("verify", parents=[common, grace], help="hash-verify every chunk and manifest")
    check.add_argument("--fix", action="store_true", help="remove what is bad and rebuild the index")
    check.set_defaults(func=_guarded(_verify, _shared_verify))
    rm = kv_sub.add_parser(
        "rm", parents=[common, grace], help="remove checkpoints (and the chunks only they use)"
    )
    rm.add_argument(
        "checkpoint_ids", nargs="*", metavar="ID", help="checkpoint ids (unique prefixes will do)"
    )
    rm.add_argument("--all", action="store_true", help="remove every checkpoint (of --model, if given)")
    rm.add_argument("--model", metavar="FP", help="only checkpoints whose model fingerprint starts with FP")
    rm.set_defaults(func=_guarded(_rm, _shared_rm))


Command = Callable[[argparse.Namespace, Path], int]
SharedCommand = Callable[[argparse.Namespace, "ObjectStore"], int]


def _guarded(command: Command, shared_command: SharedCommand) -> Callable[[argparse.Namespace], NoReturn]:
    """The command's edge: user mistakes and I/O errors become one line and exit status 1."""

    def run(args: argparse.Namespace) -> NoReturn:
        try:
            location = shared_kv_location(args)
            if location is None:
                status = command(args, args.kv_cache_dir or default_cache_dir())
            else:
                from kvserve.kvstore.shared.open_store import open_object_store

                status = shared_command(args, open_object_store(location, args.kv_s3_endpoint))
        except (KVCommandError, OSError, ValueError) as error:
            _fail(str(error))
        sys.exit(status)

    return run


def _fail(message: str) -> NoReturn:
    print(f"kvserve kv: error: {message}", file=sys.stderr)
    sys.exit(1)


def _inventories(directory: Path) -> tuple[Inventory, ...]:
    from kvserve.kvstore.inventory import scan_all

    if not directory.is_dir():
        raise KVCommandError(f"{directory} does not exist (no KV cache has been stored there)")
    try:
        return scan_all(directory)
    except FileNotFoundError as error:
        raise KVCommandError(f"{directory} is not a kvserve KV cache directory") from error


def _all_entries(inventories: Sequence[Inventory], model: str | None = None) -> list[Victim]:
    selection = PruneFilter(model=model)
    return [
        Victim(inventory, entry)
        for inventory in inventories
        for entry in inventory.entries
        if selection.matches(entry, 0.0)
    ]


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
        from kvserve.kvstore.layout import migrate_flat_layout

        migrate_flat_layout(directory)
        yield
    finally:
        lock.release()


def _ls(args: argparse.Namespace, directory: Path) -> int:
    return _print_ls(args, _inventories(directory), str(directory))


def _print_ls(args: argparse.Namespace, inventories: Sequence[Inventory], directory: str) -> int:
    now = time.time()
    found = sorted(_all_entries(inventories), key=lambda f: f.entry.checkpoint.meta.last_used, reverse=True)
    models = [fmt.model_summary(inventory) for inventory in inventories]
    if args.json:
        records = [fmt.record(f.entry, now) | {"model_dir": _model_dir(f.inventory)} for f in found]
        document = {"directory": directory, "models": models, "checkpoints": records}
        print(json.dumps(document | {"totals": fmt.totals(inventories)}, indent=2))
        return 0
    console = fmt.console()
    table = Table(
        "id", "reason", "tokens", "marginal", "total", "hits", "eff. hits", "created", "last used", "model"
    )
    for f in found:
        record = fmt.record(f.entry, now)
        table.add_row(
            f.entry.checkpoint_id[:12],
            record["reason"],
            f"{record['num_tokens']:,}",
            fmt.size(record["marginal_bytes"]),
            fmt.size(record["total_bytes"]),
            str(record["hits"]),
            f"{record['effective_hits']:.2f}",
            fmt.ago(record["created"], now),
            fmt.ago(record["last_used"], now),
            fmt.model(f.entry),
        )
    console.print(f"KV cache {escape(directory)}", highlight=False)
    if found:
        console.print(table)
    for model in models:
        name = "old flat layout (moved into a model subdirectory by the next server)"
        if not model["flat_layout"]:
            name = f"{model['model_dir'][:12]}/"
        whose = (
            "empty"
            if model["model_fingerprint"] is None
            else f"{model['model_fingerprint'][:10]}/{model['dtype']}"
        )
        console.print(
            f"  {escape(name)} {whose}: {model['num_checkpoints']} checkpoints, {fmt.size(model['bytes_on_disk'])}",
            highlight=False,
        )
    totals = fmt.totals(inventories)
    console.print(
        f"{totals['num_checkpoints']} checkpoints of {len(models)} models, {fmt.size(totals['bytes_on_disk'])} on "
        f"disk, {totals['num_unique_chunks']} unique chunks, dedup {totals['dedup_ratio']:.2f}x "
        f"({fmt.size(totals['logical_bytes'])} without sharing)",
        highlight=False,
    )
    if totals["num_unreadable_manifests"]:
        console.print(f"{totals['num_unreadable_manifests']} unreadable manifests: run `kvserve kv verify`")
    return 0


def _model_dir(inventory: Inventory) -> str:
    return inventory.model_dir_name or "."


def _resolve(inventories: Sequence[Inventory], id_prefix: str, model: str | None) -> Victim:
    prefix = id_prefix.lower()
    found = [f for f in _all_entries(inventories, model) if f.entry.checkpoint_id.startswith(prefix)]
    if not found:
        raise KVCommandError(
            f"no checkpoint {id_prefix!r} in {inventories[0].directory.parent if inventories else '?'}"
        )
    if len(found) > 1:
        ids = ", ".join(f"{f.entry.checkpoint_id[:12]} ({fmt.model(f.entry)})" for f in found[:5])
        hint = " (--model FP picks one model)" if len({f.inventory.directory for f in found}) > 1 else ""
        raise KVCommandError(
            f"checkpoint id {id_prefix!r} is ambiguous: {ids}{', ...' if len(found) > 5 else ''}{hint}"
        )
    return found[0]


def _show(args: argparse.Namespace, directory: Path) -> int:
    return _print_show(args, _inventories(directory))


def _print_show(args: argparse.Namespace, inventories: Sequence[Inventory]) -> int:
    inventory, entry = _resolve(inventories, args.checkpoint_id, args.model)
    now = time.time()
    record = fmt.record(entry, now) | {"model_dir": _model_dir(inventory)}
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
        inventories = _inventories(directory)
        budget = None if args.budget_mb is None else int(args.budget_mb * MIB)
        plan = plan_prune(inventories, time.time(), budget, PruneFilter(args.older_than, args.model))
        if not plan.fits:
            raise KVCommandError(
                f"removing every matching checkpoint would still leave more than {args.budget_mb:g} MiB; "
                "nothing removed"
            )
        return _remove(plan.victims, dry_run=args.dry_run)


def _rm(args: argparse.Namespace, directory: Path) -> int:
    if args.all == bool(args.checkpoint_ids):
        raise KVCommandError("give checkpoint ids or --all (not both)")
    with _editing(directory):
        inventories = _inventories(directory)
        if args.all:
            victims = _all_entries(inventories, args.model)
        else:  # every id resolved before anything is removed; duplicates once
            resolved = (_resolve(inventories, p, args.model) for p in args.checkpoint_ids)
            victims = list({(v.inventory.directory, v.entry.checkpoint_id): v for v in resolved}.values())
        return _remove(victims, dry_run=False)


def _print_victims(victims: Sequence[Victim], *, dry_run: bool) -> bool:
    """List what is (or would be) removed; True when that is all there is to do (a dry run)."""
    console = fmt.console()
    verb = "would remove" if dry_run else "removed"
    for _, entry in victims:
        meta = entry.checkpoint.meta
        console.print(
            f"{verb} {entry.checkpoint_id[:12]}  {meta.reason:<9} {meta.num_tokens:>8,} tokens  "
            f"{fmt.model(entry):<15} frees {fmt.size(entry.marginal_bytes)}",
            highlight=False,
        )
    if dry_run:
        console.print(f"{len(victims)} checkpoints would be removed (dry run)")
    return dry_run


def _remove(victims: Sequence[Victim], *, dry_run: bool) -> int:
    if _print_victims(victims, dry_run=dry_run):
        return 0
    console = fmt.console()
    from kvserve.kvstore.inventory import remove_checkpoints

    by_dir: dict[Path, tuple[Inventory, list[str]]] = {}
    for inventory, entry in victims:
        by_dir.setdefault(inventory.directory, (inventory, []))[1].append(entry.checkpoint_id)
    removals = [remove_checkpoints(inventory, ids) for inventory, ids in by_dir.values()]
    console.print(
        f"removed {sum(r.num_checkpoints for r in removals)} checkpoints and "
        f"{sum(r.num_chunks for r in removals)} chunks, freed {fmt.size(sum(r.num_bytes for r in removals))}",
        highlight=False,
    )
    return 0


def _verify(args: argparse.Namespace, directory: Path) -> int:
    from kvserve.kvstore.verify import fix, verify

    with _editing(directory, enabled=args.fix):
        inventories = _inventories(directory)
        reports = [(inventory, verify(inventory)) for inventory in inventories]
        console = fmt.console()
        problems = _print_reports(f"KV cache {directory}", reports)
        if not problems:
            return 0
        table = Table("problem", "file", "why")
        for problem in problems:
            relative = problem.path.relative_to(directory)
            table.add_row(problem.kind, escape(str(relative)), escape(problem.why))
        console.print(table)
        if not args.fix:
            if _is_busy(directory):
                console.print(
                    "note: a server is using this directory; files it is writing may show as orphans"
                )
            console.print(f"{len(problems)} problems; run `kvserve kv verify --fix` to remove them")
            return 1
        for inventory, report in reports:
            fix(inventory, report)
        console.print(f"fixed: removed {len(problems)} bad files and rebuilt the indexes")
        return 0


def _print_reports(where: str, reports: Sequence[tuple[Inventory, VerifyReport]]) -> list[Problem]:
    """One line per model; returns every problem (after saying "ok" when there is none)."""
    console = fmt.console()
    console.print(f"{escape(where)}: {len(reports)} models", highlight=False)
    problems: list[Problem] = []
    for inventory, report in reports:
        identity = report.identity
        model = "empty" if identity is None else f"model {identity.fingerprint} ({identity.dtype})"
        where = "old flat layout" if inventory.is_flat_layout else f"{inventory.model_dir_name[:12]}/"
        console.print(
            f"  {where} {model}: {report.num_checkpoints_ok} checkpoints and "
            f"{report.num_chunks_ok} chunks verified, {len(report.problems)} problems",
            highlight=False,
        )
        problems += report.problems
    if not problems:
        console.print("[green]ok[/green]: no problems found")
    return problems


def _is_busy(directory: Path) -> bool:
    try:
        DirLock(directory, exclusive=True).release()
    except CacheDirBusyError:
        return True
    except OSError:
        return False
    return False


# -- the shared tier (--kv-shared-dir, --kv-s3-url) -----------------------------------------


def _scan_shared(store: ObjectStore) -> SharedScan:
    from kvserve.kvstore.shared.inventory import scan_shared

    return scan_shared(store)


def _shared_ls(args: argparse.Namespace, store: ObjectStore) -> int:
    return _print_ls(args, _scan_shared(store).inventories, store.url)


def _shared_show(args: argparse.Namespace, store: ObjectStore) -> int:
    return _print_show(args, _scan_shared(store).inventories)


def _shared_prune(args: argparse.Namespace, store: ObjectStore) -> int:
    from kvserve.kvstore.shared.sweep import plan_shared_prune

    if args.budget_mb is None and args.older_than is None and args.model is None:
        raise KVCommandError("prune needs --budget-mb, --older-than or --model")
    if args.budget_mb is not None and args.budget_mb < 0:
        raise KVCommandError("--budget-mb must be >= 0")
    scan = _scan_shared(store)
    budget = None if args.budget_mb is None else int(args.budget_mb * MIB)
    now = time.time()
    plan = plan_shared_prune(scan, now, budget, PruneFilter(args.older_than, args.model), args.grace)
    if not plan.fits and not plan.victims:
        raise KVCommandError(
            f"the shared tier cannot be brought under {args.budget_mb:g} MiB now (checkpoints younger "
            "than --grace are kept); nothing removed"
        )
    status = _remove_shared(store, scan, plan.victims, args, now)
    if not plan.fits:
        fmt.console().print("note: still over the budget: checkpoints younger than --grace were kept")
    return status


def _shared_rm(args: argparse.Namespace, store: ObjectStore) -> int:
    if args.all == bool(args.checkpoint_ids):
        raise KVCommandError("give checkpoint ids or --all (not both)")
    scan = _scan_shared(store)
    if args.all:
        victims = _all_entries(scan.inventories, args.model)
    else:
        resolved = (_resolve(scan.inventories, p, args.model) for p in args.checkpoint_ids)
        victims = list({(v.inventory.directory, v.entry.checkpoint_id): v for v in resolved}.values())
    return _remove_shared(store, scan, victims, args, time.time())


def _remove_shared(
    store: ObjectStore, scan: SharedScan, victims: Sequence[Victim], args: argparse.Namespace, now: float
) -> int:
    from kvserve.kvstore.shared.sweep import remove_shared

    if _print_victims(victims, dry_run=getattr(args, "dry_run", False)):
        return 0
    removal = remove_shared(store, scan, victims, now, args.grace)
    fmt.console().print(
        f"removed {removal.num_checkpoints} checkpoints and {removal.num_chunks} chunks, freed "
        f"{fmt.size(removal.num_bytes)}; {removal.num_young_kept} unused chunks younger than --grace kept",
        highlight=False,
    )
    return 0


def _shared_verify(args: argparse.Namespace, store: ObjectStore) -> int:
    from kvserve.kvstore.shared.inventory import chunk_reader, object_key
    from kvserve.kvstore.shared.sweep import fix_shared
    from kvserve.kvstore.verify import verify

    scan = _scan_shared(store)
    read = chunk_reader(store)
    reports = [verify(inventory, read) for inventory in scan.inventories]
    console = fmt.console()
    problems = _print_reports(
        f"shared KV tier {store.url}", list(zip(scan.inventories, reports, strict=True))
    )
    if not problems:
        return 0
    table = Table("problem", "object", "why")
    for problem in problems:
        table.add_row(problem.kind, escape(object_key(store, problem.path)), escape(problem.why))
    console.print(table)
    if not args.fix:
        console.print(
            f"{len(problems)} problems (an orphan younger than a write takes may be one in progress); "
            "run `kvserve kv verify --fix` to remove them"
        )
        return 1
    deleted, kept = fix_shared(store, scan, reports, time.time(), args.grace)
    console.print(
        f"fixed: removed {deleted} bad objects; kept {kept} (younger than --grace, or another version's)"
    )
    return 0
