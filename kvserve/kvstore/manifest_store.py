"""ManifestStore: the checkpoint manifests of one cache directory (`<text sha1>.kvm`)."""

from __future__ import annotations

from pathlib import Path

from kvserve.kvstore.atomic_file import ensure_private_dir, is_temp_file, write_atomic
from kvserve.kvstore.checkpoint import StoreIdentity
from kvserve.kvstore.manifest import IncompatibleManifestError, Manifest, decode_manifest
from kvserve.kvstore.names import checked_checkpoint_id, is_checkpoint_id

SUFFIX = ".kvm"


class ManifestStore:
    def __init__(self, directory: Path, identity: StoreIdentity) -> None:
        ensure_private_dir(directory)
        self.directory = directory
        self.identity = identity

    def path(self, checkpoint_id: str) -> Path:
        """Raises UnsafeNameError for anything but a checkpoint id."""
        return self.directory / f"{checked_checkpoint_id(checkpoint_id)}{SUFFIX}"

    def ids_on_disk(self) -> set[str]:
        return {
            p.name[: -len(SUFFIX)]
            for p in self.directory.iterdir()
            if p.name.endswith(SUFFIX) and not is_temp_file(p) and is_checkpoint_id(p.name[: -len(SUFFIX)])
        }

    def read(self, checkpoint_id: str) -> Manifest:
        """Read and verify a manifest. Raises OSError, CorruptManifestError, or
        IncompatibleManifestError (other format version, model or cache layout)."""
        manifest = decode_manifest(self.path(checkpoint_id).read_bytes())
        if manifest.meta.identity != self.identity or manifest.meta.checkpoint_id != checkpoint_id:
            raise IncompatibleManifestError("written for another model or cache layout")
        return manifest

    def write(self, checkpoint_id: str, data: bytes) -> None:
        write_atomic(self.path(checkpoint_id), [data])

    def delete(self, checkpoint_id: str) -> bool:
        path = self.path(checkpoint_id)
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed
