"""Full check of a cache directory (`kvserve kv verify`): every manifest decoded, every chunk
read and hash-verified against the manifests that use it, leftovers found.

    corrupt       a manifest or chunk failing its hashes, truncated, naming the wrong thing,
                  or a manifest whose chunk is missing, corrupt or holds other tokens
    incompatible  another format version, or written for another model / KV layout than
                  the directory's (which a server removes when it opens the directory)
    orphan        a chunk file no manifest uses, or a temp file left by an interrupted write

`fix` deletes all of them and rebuilds the index from what is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvserve.kvstore.atomic_file import is_temp_file
from kvserve.kvstore.checkpoint import ChunkSpan, StoreIdentity
from kvserve.kvstore.chunk_format import CorruptChunkError, identity_digest
from kvserve.kvstore.chunk_store import ChunkStore
from kvserve.kvstore.inventory import Inventory, InventoryEntry
from kvserve.kvstore.layout import INDEX_NAME
from kvserve.kvstore.manifest_store import ManifestStore
from kvserve.kvstore.recovery import rebuild_index

ProblemKind = Literal["corrupt", "incompatible", "orphan"]

# Reads and fully verifies one chunk of a model, returning its token ids; raises CorruptChunkError
# (a missing chunk: the message "missing") or OSError. Local files by default; the shared tier's
# objects for `kvserve kv verify --kv-s3-url`.
ReadChunkTokens = Callable[[StoreIdentity, ChunkSpan], list[int]]


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    path: Path
    why: str


@dataclass(frozen=True)
class VerifyReport:
    identity: StoreIdentity | None  # the directory's model and layout; None when it holds nothing readable
    num_checkpoints_ok: int
    num_chunks_ok: int
    problems: tuple[Problem, ...]

    @property
    def is_ok(self) -> bool:
        return not self.problems


def verify(inventory: Inventory, read_tokens: ReadChunkTokens | None = None) -> VerifyReport:
    """Check everything; reads every chunk in full (slow on a big cache, by design)."""
    read = read_tokens or _file_reader(inventory)
    identity = inventory.current_identity()
    problems = [
        Problem(
            "incompatible" if u.is_incompatible else "corrupt",
            inventory.manifest_path(u.checkpoint_id),
            u.why,
        )
        for u in inventory.unreadable
    ]
    chunk_errors: dict[ChunkSpan, str | None] = {}  # each distinct chunk is read once
    num_ok = 0
    for entry in inventory.entries:
        problem = _check_entry(inventory, entry, identity, chunk_errors, read)
        if problem is None:
            num_ok += 1
        else:
            problems.append(problem)
    bad_keys = {span.key: why for span, why in chunk_errors.items() if why is not None}
    problems += [
        Problem("corrupt", inventory.chunk_path(key), why)
        for key, why in sorted(bad_keys.items())
        if key in inventory.chunk_sizes
    ]
    used = inventory.chunk_users()
    problems += [
        Problem("orphan", inventory.chunk_path(key), "no checkpoint uses it")
        for key in sorted(inventory.chunk_sizes)
        if key not in used
    ]
    problems += [Problem("orphan", path, "left by an interrupted write") for path in _temp_files(inventory)]
    num_chunks_ok = len({s.key for s, why in chunk_errors.items() if why is None} - set(bad_keys))
    return VerifyReport(identity, num_ok, num_chunks_ok, tuple(problems))


def _check_entry(
    inventory: Inventory,
    entry: InventoryEntry,
    identity: StoreIdentity | None,
    chunk_errors: dict[ChunkSpan, str | None],
    read: ReadChunkTokens,
) -> Problem | None:
    meta = entry.checkpoint.meta
    path = inventory.manifest_path(entry.checkpoint_id)
    if meta.identity != identity:
        return Problem(
            "incompatible", path, f"written for model {meta.identity.fingerprint} ({meta.identity.dtype})"
        )
    for span in entry.checkpoint.chunks:
        if span not in chunk_errors:
            chunk_errors[span] = _chunk_error(read, meta.identity, span, entry.token_ids)
        if span.key not in inventory.chunk_sizes:
            return Problem("corrupt", path, f"its chunk {span.key} is missing")
        if chunk_errors[span] is not None:
            return Problem("corrupt", path, f"its chunk {span.key} is corrupt")
    return None


def _file_reader(inventory: Inventory) -> ReadChunkTokens:
    def read(identity: StoreIdentity, span: ChunkSpan) -> list[int]:
        chunks = ChunkStore(inventory.directory / "chunks", identity)
        if not chunks.path(span.key).exists():
            raise CorruptChunkError("missing")
        return chunks.read(span)[0]

    return read


def _chunk_error(
    read: ReadChunkTokens, identity: StoreIdentity, span: ChunkSpan, token_ids: Sequence[int]
) -> str | None:
    try:
        chunk_tokens = read(identity, span)
    except CorruptChunkError as error:
        # "missing" is reported on the manifests using it: there is no file to blame
        return str(error)
    except OSError as error:
        return f"unreadable: {error}"
    if chunk_tokens != list(token_ids[span.start : span.end]):
        return "holds other tokens than its checkpoint"
    return None


def _temp_files(inventory: Inventory) -> list[Path]:
    found = []
    for sub in ("checkpoints", "chunks"):
        directory = inventory.directory / sub
        if directory.is_dir():
            found += sorted(p for p in directory.iterdir() if is_temp_file(p))
    return found


def fix(inventory: Inventory, report: VerifyReport) -> None:
    """Delete every problem file (manifests first), then rebuild the index from the rest.
    The caller holds the directory's exclusive lock (no server is writing)."""
    order = {"checkpoints": 0, "chunks": 1}
    for problem in sorted(report.problems, key=lambda p: order.get(p.path.parent.name, 2)):
        problem.path.unlink(missing_ok=True)
    index = inventory.directory / INDEX_NAME
    if report.identity is None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)
        return
    manifests = ManifestStore(inventory.directory / "checkpoints", report.identity)
    chunks = ChunkStore(inventory.directory / "chunks", report.identity)
    rebuild_index(index, identity_digest(report.identity).hex(), manifests, chunks).close()
