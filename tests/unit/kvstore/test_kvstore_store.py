"""CheckpointStore on a real directory: round trips, dedup, corruption, incompatibility,
index recovery, atomicity leftovers, permissions, lookups and bookkeeping."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from kvstore_helpers import (
    Clock,
    Provider,
    bits,
    kv_for,
    make_identity,
    model_dir,
    open_store,
    random_tokens,
    save,
    text_of,
)

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import CheckpointMeta, StoreIdentity, TextKey


def chunk_files(root: Path, identity: StoreIdentity | None = None) -> list[Path]:
    return sorted((model_dir(root, identity) / "chunks").glob("*.kvc"))


def manifest_path(root: Path, token_ids: list[int], identity: StoreIdentity | None = None) -> Path:
    return model_dir(root, identity) / "checkpoints" / f"{TextKey.of(text_of(token_ids)).sha1}.kvm"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_save_then_load_is_bit_exact(tmp_path: Path, dtype: str) -> None:
    identity = make_identity(dtype)
    store = open_store(tmp_path, identity)
    tokens = random_tokens(53, 0)  # 3 full chunks and a tail ending mid-block
    assert save(store, tokens).status == "stored"
    checkpoint = store.lookup_by_text_prefix(text_of(tokens))
    assert checkpoint is not None and checkpoint.meta.num_tokens == 53
    loaded = store.load(checkpoint)
    assert loaded is not None and list(loaded.token_ids) == tokens
    for expected, got in zip(kv_for(tokens, identity), loaded.kv, strict=True):
        assert got.shape == (2, 53, 2, 4) and got.dtype == identity.torch_dtype
        assert torch.equal(bits(got), bits(expected))


def test_a_shared_prefix_is_stored_once(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = random_tokens(64, 1)
    second = first[:48] + random_tokens(16, 2)  # shares 3 of its 4 chunks
    assert save(store, first).num_new_chunks == 4
    provider = Provider(kv_for(second, store.identity))
    result = save(store, second, provider=provider)
    assert result.status == "stored" and result.num_new_chunks == 1
    assert [(s.start, s.end) for s in provider.calls] == [(48, 64)]  # only the missing chunk was copied out
    assert len(chunk_files(tmp_path)) == 5
    loaded = store.load(store.lookup_by_text_prefix(text_of(second)))
    assert loaded is not None and list(loaded.token_ids) == second
    assert all(torch.equal(a, b) for a, b in zip(kv_for(second, store.identity), loaded.kv, strict=True))


def test_saving_the_same_text_again_keeps_the_existing_checkpoint(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(40, 3)
    save(store, tokens)
    assert save(store, tokens).status == "exists"


def test_delete_frees_only_chunks_no_other_checkpoint_uses(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = random_tokens(64, 4)
    second = first[:48] + random_tokens(16, 5)
    save(store, first)
    save(store, second)
    assert store.delete(TextKey.of(text_of(first)).sha1)
    assert len(chunk_files(tmp_path)) == 4 and store.stats().num_checkpoints == 1
    assert store.load(TextKey.of(text_of(second)).sha1) is not None


def test_a_flipped_byte_in_a_chunk_removes_every_checkpoint_using_it(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = random_tokens(64, 6)
    second = first[:48] + random_tokens(16, 7)
    save(store, first)
    save(store, second)
    shared = store.get(TextKey.of(text_of(first)).sha1).chunks[1]
    path = model_dir(tmp_path) / "chunks" / f"{shared.key}.kvc"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(data)
    assert store.load(TextKey.of(text_of(first)).sha1) is None
    assert store.stats().num_checkpoints == 0 and not path.exists()
    assert store.lookup_by_text_prefix(text_of(second)) is None
    assert chunk_files(tmp_path) == [] and store.stats().num_corrupt_removed == 2


def test_a_corrupt_manifest_is_removed_on_load(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(40, 8)
    save(store, tokens)
    path = manifest_path(tmp_path, tokens)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(data)
    assert store.load(TextKey.of(text_of(tokens)).sha1) is None
    assert not path.exists() and chunk_files(tmp_path) == []


@pytest.mark.parametrize(
    "other", [make_identity(fingerprint="another-model:bfloat16:none"), make_identity("float32")]
)
def test_models_alternating_in_one_directory_keep_each_others_checkpoints(
    tmp_path: Path, other: StoreIdentity
) -> None:
    first, second = random_tokens(40, 9), random_tokens(40, 10)
    store = open_store(tmp_path)
    save(store, first)
    store.close()
    other_store = open_store(tmp_path, other)
    assert other_store.stats().num_checkpoints == 0  # A's entries are not B's ...
    assert save(other_store, second).status == "stored"
    other_store.close()
    assert len(chunk_files(tmp_path)) == 3  # ... and B's store left them alone
    reopened = open_store(tmp_path)
    assert (
        reopened.stats().num_checkpoints == 1 and reopened.load(TextKey.of(text_of(first)).sha1) is not None
    )
    assert open_store(tmp_path, other).load(TextKey.of(text_of(second)).sha1) is not None


def test_an_entry_of_another_model_inside_a_models_subdirectory_is_removed(tmp_path: Path) -> None:
    other = make_identity(fingerprint="another-model:bfloat16:none")
    tokens = random_tokens(40, 11)
    assert save(open_store(tmp_path, other), tokens).status == "stored"
    open_store(tmp_path).close()  # creates our own subdirectory
    for chunk in chunk_files(tmp_path, other):  # copied by hand into the wrong subdirectory
        (model_dir(tmp_path) / "chunks" / chunk.name).write_bytes(chunk.read_bytes())
    manifest_path(tmp_path, tokens).write_bytes(manifest_path(tmp_path, tokens, other).read_bytes())
    store = open_store(tmp_path)
    assert store.stats().num_checkpoints == 0
    assert chunk_files(tmp_path) == [] and not manifest_path(tmp_path, tokens).exists()
    assert len(chunk_files(tmp_path, other)) == 3  # the other model's own copy is untouched


def test_a_save_for_another_identity_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(20, 11)
    meta = CheckpointMeta.new(make_identity(fingerprint="x"), "t", 20, "cold")
    hashes = compute_block_hashes(tokens, 4, "x")
    assert store.save(meta, tokens, hashes, Provider(kv_for(tokens, store.identity))).status == "incompatible"


@pytest.mark.parametrize("damage", ["delete", "garble", "truncate", "stale"])
def test_the_index_is_rebuilt_from_the_files(tmp_path: Path, damage: str) -> None:
    store = open_store(tmp_path)
    first, second = random_tokens(64, 12), random_tokens(30, 13)
    save(store, first)
    if damage != "stale":
        save(store, second)
    store.close()
    index = model_dir(tmp_path) / "index.sqlite"
    if damage == "delete":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)
    elif damage == "garble":
        for suffix in ("-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)
        index.write_bytes(b"this is not a database" * 100)
    elif damage == "truncate":
        index.write_bytes(index.read_bytes()[:100])
    else:  # a manifest written after the index last saw the directory (crash before the index commit)
        other = open_store(tmp_path / "elsewhere")
        save(other, second)
        other.close()
        src = manifest_path(tmp_path / "elsewhere", second)
        for chunk in chunk_files(tmp_path / "elsewhere"):
            (model_dir(tmp_path) / "chunks" / chunk.name).write_bytes(chunk.read_bytes())
        manifest_path(tmp_path, second).write_bytes(src.read_bytes())
    reopened = open_store(tmp_path)
    assert reopened.stats().num_checkpoints == 2
    for tokens in (first, second):
        loaded = reopened.load(reopened.lookup_by_text_prefix(text_of(tokens)))
        assert loaded is not None and list(loaded.token_ids) == tokens


def test_orphan_chunks_and_manifests_missing_a_chunk_are_cleaned_at_open(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first, second = random_tokens(40, 14), random_tokens(40, 15)
    save(store, first)
    save(store, second)
    store.close()
    (model_dir(tmp_path) / "chunks" / f"{'f' * 32}.kvc").write_bytes(
        b"orphan"
    )  # a crash between chunk and manifest
    (model_dir(tmp_path) / "chunks" / f"{open_store_chunk_key(tmp_path, second)}.kvc").unlink()
    reopened = open_store(tmp_path)
    assert [c.checkpoint_id for c in reopened.checkpoints()] == [TextKey.of(text_of(first)).sha1]
    assert len(chunk_files(tmp_path)) == 3


def open_store_chunk_key(directory: Path, token_ids: list[int]) -> str:
    from kvserve.kvstore.manifest import decode_manifest

    return decode_manifest(manifest_path(directory, token_ids).read_bytes()).chunks[0].key


def test_leftover_temp_files_are_ignored_and_removed(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(40, 16)
    save(store, tokens)
    store.close()
    leftovers = [
        model_dir(tmp_path) / "chunks" / f"{'a' * 32}.kvc.tmp.999.0",
        model_dir(tmp_path) / "checkpoints" / f"{'b' * 40}.kvm.tmp.999.1",
    ]
    for path in leftovers:
        path.write_bytes(b"half written")
    reopened = open_store(tmp_path)
    assert not any(path.exists() for path in leftovers)
    assert (
        reopened.stats().num_checkpoints == 1 and reopened.load(TextKey.of(text_of(tokens)).sha1) is not None
    )


def test_directories_are_private_and_files_0600(tmp_path: Path) -> None:
    os.umask(0o022)
    directory = tmp_path / "cache"
    store = open_store(directory)
    save(store, random_tokens(40, 17))
    store.hit(store.checkpoints()[0].checkpoint_id)
    own = model_dir(directory)
    for path in [directory, own, own / "chunks", own / "checkpoints"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert any(p.name == "index.sqlite" for p in files) and any(p.suffix == ".kvc" for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_lookup_by_text_prefix_picks_the_longest_stored_prefix(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(100, 18)
    for length in (20, 60, 90):
        save(store, tokens[:length])
    prompt = text_of(tokens) + " and a new user turn"
    assert store.lookup_by_text_prefix(prompt).meta.num_tokens == 90
    assert store.lookup_by_text_prefix(text_of(tokens[:75])).meta.num_tokens == 60
    assert store.lookup_by_text_prefix(prompt, max_tokens=80).meta.num_tokens == 60
    assert store.lookup_by_text_prefix(text_of(tokens[:19])) is None
    assert store.lookup_by_text_prefix("<1>" + text_of(tokens)) is None


def test_lookup_by_block_hashes_finds_the_longest_run_of_stored_chunks(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(200, 19)
    save(store, tokens[:40])  # chunks [0,16) [16,32) [32,40)
    save(store, tokens[:70])  # adds [32,48) [48,64) [64,70)
    hashes = compute_block_hashes(tokens, 4, store.identity.fingerprint)
    run = store.lookup_by_block_hashes(hashes)
    assert run is not None and run.num_tokens == 64  # [64,70) ends mid-block: not findable by hashes
    assert run.checkpoint_ids == (TextKey.of(text_of(tokens[:70])).sha1,)
    loaded = store.load_run(run)
    expected = kv_for(tokens[:64], store.identity)
    assert loaded is not None and list(loaded.token_ids) == tokens[:64]
    assert all(torch.equal(a, b) for a, b in zip(expected, loaded.kv, strict=True))
    short = store.lookup_by_block_hashes(
        hashes[:9]
    )  # a request of 36 tokens: the [32,36) block is not stored
    assert short is not None and short.num_tokens == 32
    branch = tokens[:20] + random_tokens(50, 20)
    partial = store.lookup_by_block_hashes(compute_block_hashes(branch, 4, store.identity.fingerprint))
    assert partial is not None and partial.num_tokens == 16
    assert store.lookup_by_block_hashes(compute_block_hashes(random_tokens(64, 21), 4, "x")) is None


def test_a_block_aligned_partial_chunk_is_found_by_block_hashes(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(64, 22)
    save(store, tokens[:40])  # tail chunk [32, 40) ends on a block boundary
    run = store.lookup_by_block_hashes(compute_block_hashes(tokens, 4, store.identity.fingerprint))
    assert run is not None and run.num_tokens == 40


def test_hits_and_last_used_are_persisted_in_the_manifest(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    store = open_store(tmp_path, clock=clock)
    tokens = random_tokens(40, 23)
    save(store, tokens)
    checkpoint_id = TextKey.of(text_of(tokens)).sha1
    clock.now = 2000.0
    assert store.load(checkpoint_id) is not None
    clock.now = 3000.0
    store.touch(checkpoint_id)
    store.close()
    (model_dir(tmp_path) / "index.sqlite").unlink()  # the manifest alone must carry the bookkeeping
    meta = open_store(tmp_path, clock=clock).get(checkpoint_id).meta
    assert (meta.hits, meta.last_used, meta.created) == (1, 3000.0, 1000.0)


def test_verify_removes_entries_whose_payload_is_corrupt(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    good, bad = random_tokens(40, 24), random_tokens(40, 25)
    save(store, good)
    save(store, bad)
    key = store.get(TextKey.of(text_of(bad)).sha1).chunks[-1].key
    path = model_dir(tmp_path) / "chunks" / f"{key}.kvc"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x80  # payload only: the cheap header check at open cannot see it
    path.write_bytes(data)
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.stats().num_checkpoints == 2
    assert reopened.verify() == 1
    assert [c.checkpoint_id for c in reopened.checkpoints()] == [TextKey.of(text_of(good)).sha1]
    assert reopened.verify() == 0 and reopened.get(TextKey.of(text_of(good)).sha1).meta.hits == 0


def test_a_save_that_fails_midway_leaves_no_files(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(64, 26)
    inner = Provider(kv_for(tokens, store.identity))

    def failing_after_two(span):
        if len(inner.calls) == 2:
            raise OSError(28, "No space left on device")
        return inner(span)

    meta = CheckpointMeta.new(store.identity, text_of(tokens), 64, "cold")
    hashes = compute_block_hashes(tokens, 4, store.identity.fingerprint)
    assert store.save(meta, tokens, hashes, failing_after_two).status == "failed"
    assert chunk_files(tmp_path) == [] and list((model_dir(tmp_path) / "checkpoints").iterdir()) == []
    assert save(store, tokens).status == "stored"


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    open_store(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((model_dir(shared) / "chunks").stat().st_mode) == 0o700


def test_the_engine_copies_out_only_missing_chunks_and_a_vanished_one_skips_the_save(tmp_path: Path) -> None:
    from kvserve.kvstore.checkpoint_store import ChunkUnavailableError

    store = open_store(tmp_path)
    first = random_tokens(64, 27)
    second = first[:48] + random_tokens(24, 28)
    save(store, first)
    hashes = compute_block_hashes(second, 4, store.identity.fingerprint)
    missing = store.missing_spans(second, hashes)
    assert [(s.start, s.end) for s in missing] == [(48, 64), (64, 72)]
    kv = kv_for(second, store.identity)
    copied = {span: [layer[:, span.start : span.end].clone() for layer in kv] for span in missing}

    def provider(span):
        if span not in copied:
            raise ChunkUnavailableError(span.key)
        return copied[span]

    store.delete(TextKey.of(text_of(first)).sha1)  # the shared chunks vanish before the save runs
    meta = CheckpointMeta.new(store.identity, text_of(second), len(second), "evict")
    assert store.save(meta, second, hashes, provider).status == "unavailable"
    assert chunk_files(tmp_path) == [] and store.stats().num_checkpoints == 0


def test_token_ids_come_from_the_manifest_without_reading_kv(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    tokens = random_tokens(40, 29)
    save(store, tokens)
    for chunk in chunk_files(tmp_path):
        chunk.unlink()
    checkpoint = store.lookup_by_text_prefix(text_of(tokens) + "<5>")
    assert store.token_ids(checkpoint) == tokens
    assert store.load(checkpoint) is None and store.token_ids(checkpoint) is None  # KV gone: entry removed


def test_the_budget_bounds_the_whole_directory_but_a_store_evicts_only_its_own_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = make_identity(fingerprint="another-model:bfloat16:none")
    first = open_store(tmp_path, other)
    save(first, random_tokens(64, 20))
    first.close()
    other_bytes = sum(p.stat().st_size for p in model_dir(tmp_path, other).glob("c*/*"))
    budget = other_bytes + 6000  # room beside the other model for about one 64-token checkpoint
    store = open_store(tmp_path, budget_bytes=budget)
    assert save(store, random_tokens(64, 21)).status == "stored"
    assert save(store, random_tokens(64, 22)).status == "stored"  # evicted its own first one
    assert [c.meta.num_tokens for c in store.checkpoints()] == [64] and store.stats().num_evictions == 1
    assert len(chunk_files(tmp_path, other)) == 4  # never the other model's
    store.close()
    crowded = open_store(tmp_path, budget_bytes=other_bytes + 100)
    assert crowded.stats().num_checkpoints == 0  # trimmed to what the other model leaves: nothing
    assert save(crowded, random_tokens(64, 23)).status == "too_large"  # beside the other model
    assert any("other models' checkpoints take" in r.getMessage() for r in caplog.records)
    assert len(chunk_files(tmp_path, other)) == 4
