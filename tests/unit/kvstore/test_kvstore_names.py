"""No name reaches outside the cache directory (issue 37): checkpoint ids and chunk keys are checked
before they become paths, whether a caller or a manifest on disk supplies them."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvstore_helpers import make_identity, model_dir, open_store, random_tokens, save, text_of

from kvserve.kvstore.checkpoint import ChunkSpan, TextKey
from kvserve.kvstore.chunk_store import ChunkStore
from kvserve.kvstore.manifest import CorruptManifestError, decode_manifest, encode_manifest
from kvserve.kvstore.manifest_store import ManifestStore
from kvserve.kvstore.names import UnsafeNameError

HOSTILE = [
    "../../../outside",
    "../../outside",
    "/etc/passwd",
    "a/b",
    "..",
    "",
    "0" * 39 + "/",
    "0" * 40 + "\x00",
    "0" * 41,
    "ABCDEF" + "0" * 34,  # ids are lower case
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_checkpoint_id_is_never_a_path(tmp_path: Path, name: str) -> None:
    store = open_store(tmp_path / "kv")
    outside = tmp_path / "outside.kvm"
    outside.write_bytes(b"not yours")
    assert store.get(name) is None
    assert store.token_ids(name) is None
    assert store.load(name) is None
    assert store.touch(name) is False
    assert store.delete(name) is False
    assert outside.read_bytes() == b"not yours"
    with pytest.raises(UnsafeNameError):
        ManifestStore(tmp_path / "m", make_identity()).path(name)
    with pytest.raises(UnsafeNameError):
        ChunkStore(tmp_path / "c", make_identity()).path(name)


def test_a_manifest_naming_a_chunk_outside_is_corrupt(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(40, 1)
    save(store, tokens)
    checkpoint_id = TextKey.of(text_of(tokens)).sha1
    manifest = store._files.read_manifest(checkpoint_id)
    assert manifest is not None
    spans = [ChunkSpan("../../../../outside", s.start, s.end) for s in manifest.chunks]
    with pytest.raises(CorruptManifestError):
        decode_manifest(encode_manifest(manifest.meta, manifest.token_ids, spans))


def test_files_that_are_not_ours_are_left_alone(tmp_path: Path) -> None:
    """A stray file in the store's folders is neither read nor deleted (an id is 40 hex digits)."""
    store = open_store(tmp_path)
    save(store, random_tokens(40, 2))
    store.close()
    strays = [model_dir(tmp_path) / "checkpoints" / "notes.kvm", model_dir(tmp_path) / "chunks" / "x.kvc"]
    for stray in strays:
        stray.write_text("mine")
    store = open_store(tmp_path)
    assert store.stats().num_checkpoints == 1
    assert all(stray.read_text() == "mine" for stray in strays)
