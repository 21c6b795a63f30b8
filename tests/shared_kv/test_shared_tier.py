"""The shared KV tier over a real shared directory and a real S3 server (SeaweedFS): what one
replica publishes another finds and loads bit for bit, a chunk common to both is stored once, and a
corrupt object is never loaded (it is removed, so it can be written again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint_store import CheckpointStore
from kvserve.kvstore.shared.keys import chunk_key, chunks_prefix, manifest_key, manifests_prefix
from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.shared.open_store import open_object_store
from kvserve.kvstore.shared.tier import SharedTier
from tests.unit.kvstore.kvstore_helpers import (
    CHUNK_TOKENS,
    FINGERPRINT,
    bits,
    kv_for,
    make_identity,
    open_store,
    random_tokens,
    save,
    text_of,
)


def _tier(store: ObjectStore, **kwargs: float) -> SharedTier:
    return SharedTier(store, make_identity(), chunk_tokens=CHUNK_TOKENS, background=False, **kwargs)


def _publish(tier: SharedTier, local: CheckpointStore, token_ids: list[int]) -> str:
    result = save(local, token_ids)
    assert result.status == "stored"
    assert tier.publish_now(local, result.checkpoint_id)
    return result.checkpoint_id


def _hashes(token_ids: list[int]) -> list[int]:
    return compute_block_hashes(token_ids, make_identity().block_size, FINGERPRINT)


def _objects(store: ObjectStore, prefix: str) -> list[str]:
    return sorted(info.key for info in store.list(prefix))


def test_a_checkpoint_published_by_one_replica_loads_on_another(
    object_store: ObjectStore, shared_location: tuple[str, str | None], tmp_path: Path
) -> None:
    reader = _tier(open_object_store(*shared_location), miss_refresh_s=0.0)  # started before the write
    writer = _tier(object_store)
    tokens = random_tokens(72, seed=1)  # 4 full chunks of 16 and a short one of 8 (2 blocks)
    _publish(writer, open_store(tmp_path / "a"), tokens)

    prompt = tokens + random_tokens(9, seed=2)
    hashes = _hashes(prompt)
    assert reader.lookup_by_block_hashes(hashes) is None  # its index predates the write
    run = reader.lookup_by_block_hashes(hashes, want_tokens=len(hashes) * 4)  # a miss refreshes
    assert run is not None and run.num_tokens == 72
    loaded = reader.load_run(run)
    assert loaded is not None and list(loaded.token_ids) == tokens
    expected = kv_for(tokens, make_identity())
    for got, want in zip(loaded.kv, expected, strict=True):
        assert bits(got).equal(bits(want))
    # The text-prefix lookup (prompt assembly) finds it too, with its exact tokens.
    found = reader.text_prefix(text_of(tokens) + "<and more>")
    assert found == (tokens, len(text_of(tokens).encode()))


def test_a_chunk_shared_by_two_replicas_is_stored_once(object_store: ObjectStore, tmp_path: Path) -> None:
    first, second = _tier(object_store), _tier(object_store)
    common = random_tokens(48, seed=3)  # three whole chunks both conversations start with
    a = _publish(first, open_store(tmp_path / "a"), common + random_tokens(20, seed=4))
    b = _publish(second, open_store(tmp_path / "b"), common + random_tokens(20, seed=5))
    identity = make_identity()
    chunks = _objects(object_store, chunks_prefix(identity))
    assert len(chunks) == 3 + 2 * 2  # the common three once, then each one's own two
    assert second.stats().num_chunks_written == 2  # it found the common ones there
    assert _objects(object_store, manifests_prefix(identity)) == sorted(
        [manifest_key(identity, a), manifest_key(identity, b)]
    )
    # Publishing again writes nothing.
    assert first.publish_now(open_store(tmp_path / "a"), a)
    assert first.stats().num_published == 1 and len(_objects(object_store, chunks_prefix(identity))) == 7


def test_a_corrupt_chunk_is_never_loaded_and_is_removed(object_store: ObjectStore, tmp_path: Path) -> None:
    writer = _tier(object_store)
    tokens = random_tokens(40, seed=6)
    checkpoint_id = _publish(writer, open_store(tmp_path / "a"), tokens)
    identity = make_identity()
    key = chunk_key(identity, writer.index.get(checkpoint_id).chunks[1].key)
    data = bytearray(object_store.get(key))
    data[-3] ^= 0x40  # one flipped bit in the KV payload
    object_store.delete(key)
    assert object_store.put_if_absent(key, bytes(data))

    reader = _tier(object_store)
    run = reader.lookup_by_block_hashes(_hashes(tokens))
    assert run is not None and run.num_tokens == 40
    assert reader.load_run(run) is None
    assert object_store.get(key) is None  # gone, so the next writer of that chunk can write it
    assert object_store.get(manifest_key(identity, checkpoint_id)) is None
    assert reader.lookup_by_block_hashes(_hashes(tokens)) is None and reader.stats().num_corrupt_removed == 1
    # The owner publishes it again (its local copy is sound), and now it loads.
    writer.index.remove(checkpoint_id)
    assert writer.publish_now(open_store(tmp_path / "a"), checkpoint_id)
    reader.refresh()
    loaded = reader.load_run(reader.lookup_by_block_hashes(_hashes(tokens)))
    assert loaded is not None and list(loaded.token_ids) == tokens


def test_a_corrupt_manifest_is_removed_at_refresh(object_store: ObjectStore, tmp_path: Path) -> None:
    writer = _tier(object_store)
    checkpoint_id = _publish(writer, open_store(tmp_path / "a"), random_tokens(40, seed=7))
    key = manifest_key(make_identity(), checkpoint_id)
    data = bytearray(object_store.get(key))
    data[-1] ^= 1
    object_store.delete(key)
    object_store.put_if_absent(key, bytes(data))
    reader = _tier(object_store)
    assert len(reader.index) == 0 and object_store.get(key) is None


def test_put_if_absent_keeps_the_first_object(object_store: ObjectStore) -> None:
    key = chunk_key("0" * 32, "1" * 32)
    assert object_store.put_if_absent(key, b"first")
    assert not object_store.put_if_absent(key, b"second")
    assert object_store.get(key) == b"first"
    assert [(i.key, i.size) for i in object_store.list("0" * 32 + "/")] == [(key, 5)]
    object_store.delete(key)
    object_store.delete(key)  # gone already: no error
    assert object_store.get(key) is None


def test_an_unreachable_s3_store_fails_at_open_with_a_clear_error() -> None:
    with pytest.raises(OSError, match="s3"):
        open_object_store("s3://kvserve-test/x", "http://127.0.0.1:9")  # nothing listens on port 9


def test_a_directory_without_hard_links_falls_back_to_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some network filesystems refuse link(2) (EPERM): the object is renamed into place instead,
    which for a content-addressed key replaces bytes with the same bytes; no temp file is left."""
    import errno
    import os

    def no_links(source: object, target: object) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    store = open_object_store(str(tmp_path / "shared"))
    monkeypatch.setattr(os, "link", no_links)
    key = chunk_key("0" * 32, "2" * 32)
    assert store.put_if_absent(key, b"bytes")
    assert not store.put_if_absent(key, b"bytes")  # present: not written again
    assert store.get(key) == b"bytes"
    assert list((tmp_path / "shared").rglob("*.tmp.*")) == []
