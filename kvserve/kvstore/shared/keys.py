"""Where the shared tier keeps what (pure): the local cache directory's own layout, as object keys.

    <model>/checkpoints/<text sha1>.kvm   a manifest (kvstore/manifest.py), written once
    <model>/chunks/<chain hash>.kvc       a content-addressed chunk (kvstore/chunk_format.py)

`<model>` is the store identity's digest (`layout.model_dir_name`), so replicas of other models
share a bucket without meeting, and a shared directory reads like a local cache directory.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from kvserve.kvstore.checkpoint import StoreIdentity
from kvserve.kvstore.layout import CHECKPOINTS, CHUNK_SUFFIX, CHUNKS, MANIFEST_SUFFIX, model_dir_name

ObjectKind = Literal["manifest", "chunk"]
_HEX = {"manifest": re.compile(r"^[0-9a-f]{40}$"), "chunk": re.compile(r"^[0-9a-f]{32}$")}
_MODEL = re.compile(r"^[0-9a-f]{32}$")


class ParsedKey(NamedTuple):
    model: str  # the identity digest
    kind: ObjectKind
    name: str  # checkpoint id (text SHA1) or chunk key (chain hash)


def model_prefix(identity: StoreIdentity | str) -> str:
    model = identity if isinstance(identity, str) else model_dir_name(identity)
    return f"{model}/"


def manifests_prefix(identity: StoreIdentity | str) -> str:
    return f"{model_prefix(identity)}{CHECKPOINTS}/"


def chunks_prefix(identity: StoreIdentity | str) -> str:
    return f"{model_prefix(identity)}{CHUNKS}/"


def manifest_key(identity: StoreIdentity | str, checkpoint_id: str) -> str:
    return f"{manifests_prefix(identity)}{checkpoint_id}{MANIFEST_SUFFIX}"


def chunk_key(identity: StoreIdentity | str, key: str) -> str:
    return f"{chunks_prefix(identity)}{key}{CHUNK_SUFFIX}"


def parse_key(key: str) -> ParsedKey | None:
    """The parts of a manifest or chunk key; None for anything else (temp files, strangers)."""
    parts = key.split("/")
    if len(parts) != 3 or not _MODEL.match(parts[0]):
        return None
    model, folder, file_name = parts
    for kind, sub, suffix in (("manifest", CHECKPOINTS, MANIFEST_SUFFIX), ("chunk", CHUNKS, CHUNK_SUFFIX)):
        if folder == sub and file_name.endswith(suffix):
            name = file_name[: -len(suffix)]
            if _HEX[kind].match(name):
                return ParsedKey(model, kind, name)  # type: ignore[arg-type]
    return None
