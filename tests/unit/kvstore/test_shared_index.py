"""The shared tier's pure parts: the object key layout, the refresh plan, the refresh schedule and
the in-memory index (milliseconds, no store)."""

from __future__ import annotations

from kvserve.kvstore.checkpoint import ChunkSpan, TextKey
from kvserve.kvstore.layout import model_dir_name
from kvserve.kvstore.shared.index import (
    ObjectStamp,
    RefreshSchedule,
    SharedEntry,
    SharedIndex,
    plan_refresh,
)
from kvserve.kvstore.shared.keys import chunk_key, manifest_key, manifests_prefix, parse_key
from kvserve.kvstore.shared.object_store import ObjectInfo
from tests.unit.kvstore.kvstore_helpers import make_identity

MODEL = "0123456789abcdef0123456789abcdef"
ID_A, ID_B, ID_C = "a" * 40, "b" * 40, "c" * 40
KEY_1, KEY_2, KEY_3 = "1" * 32, "2" * 32, "3" * 32


def test_keys_follow_the_local_layout_and_parse_back() -> None:
    identity = make_identity()
    model = model_dir_name(identity)
    assert manifest_key(identity, ID_A) == f"{model}/checkpoints/{ID_A}.kvm"
    assert chunk_key(identity, KEY_1) == f"{model}/chunks/{KEY_1}.kvc"
    assert manifests_prefix(identity) == f"{model}/checkpoints/"
    assert parse_key(manifest_key(model, ID_A)) == (model, "manifest", ID_A)
    assert parse_key(chunk_key(model, KEY_1)) == (model, "chunk", KEY_1)
    for stranger in (
        f"{model}/checkpoints/{ID_A}.kvm.tmp.host.1.2",  # a write in progress
        f"{model}/chunks/{ID_A}.kvc",  # 40 hex digits: not a chain hash
        f"{model}/checkpoints/{KEY_1}.kvm",  # 32: not a text SHA1
        f"{model}/chunks/{KEY_1}.kvm",
        f"{model}/index.sqlite",
        "lock",
        f"nothex{'0' * 26}/chunks/{KEY_1}.kvc",
        f"x/{model}/chunks/{KEY_1}.kvc",
    ):
        assert parse_key(stranger) is None, stranger


def _listing(*entries: tuple[str, int, float]) -> list[ObjectInfo]:
    return [ObjectInfo(manifest_key(MODEL, cid), size, modified) for cid, size, modified in entries]


def test_refresh_reads_new_and_rewritten_manifests_and_drops_vanished_ones() -> None:
    known = {ID_A: ObjectStamp(100, 1.0), ID_B: ObjectStamp(100, 1.0)}
    listing = _listing((ID_A, 100, 1.0), (ID_C, 90, 2.0))
    listing.append(ObjectInfo(chunk_key(MODEL, KEY_1), 5, 1.0))  # chunks are not manifests
    listing.append(ObjectInfo(manifest_key("f" * 32, ID_B), 5, 1.0))  # another model's
    plan = plan_refresh(MODEL, listing, known, {})
    assert plan.fetch == ((ID_C, ObjectStamp(90, 2.0)),)
    assert plan.drop == (ID_B,)
    # Deleted by a sweeper and written again by another replica: a new stamp, read again.
    again = plan_refresh(MODEL, _listing((ID_A, 100, 5.0)), known, {})
    assert again.fetch == ((ID_A, ObjectStamp(100, 5.0)),) and again.drop == (ID_B,)


def test_refresh_does_not_reread_an_unusable_manifest_until_it_changes() -> None:
    skipped = {ID_A: ObjectStamp(100, 1.0)}
    assert plan_refresh(MODEL, _listing((ID_A, 100, 1.0)), {}, skipped).fetch == ()
    assert plan_refresh(MODEL, _listing((ID_A, 120, 3.0)), {}, skipped).fetch == (
        (ID_A, ObjectStamp(120, 3.0)),
    )


def test_a_published_entry_is_replaced_by_its_listed_stamp() -> None:
    known = {ID_A: ObjectStamp(100, -1.0)}  # what a replica records for its own publish
    assert plan_refresh(MODEL, _listing((ID_A, 100, 7.0)), known, {}).fetch == (
        (ID_A, ObjectStamp(100, 7.0)),
    )


def test_schedule_lists_periodically_and_on_a_miss_at_most_every_miss_interval() -> None:
    schedule = RefreshSchedule(interval_s=10.0, miss_interval_s=1.0)
    assert schedule.due(0.0) and schedule.due(0.0, miss=True)
    schedule.done(100.0)
    assert not schedule.due(100.5, miss=True) and schedule.due(101.0, miss=True)
    assert not schedule.due(109.0) and schedule.due(110.0)


def _entry(cid: str, spans: tuple[ChunkSpan, ...], text_bytes: int = 10) -> SharedEntry:
    return SharedEntry(cid, TextKey(cid, text_bytes), spans[-1].end, 1.0, spans, ObjectStamp(1, 1.0))


def test_index_counts_chunk_users_and_forgets_a_chunk_with_its_last_user() -> None:
    index = SharedIndex()
    first, second, third = ChunkSpan(KEY_1, 0, 16), ChunkSpan(KEY_2, 16, 32), ChunkSpan(KEY_3, 16, 24)
    index.add(_entry(ID_A, (first, second), text_bytes=40))
    index.add(_entry(ID_B, (first, third), text_bytes=30))
    assert index.users_of(KEY_1) == [ID_A, ID_B] and index.users_of(KEY_2) == [ID_A]
    # The same key with another extent is not the stored chunk.
    assert index.stored_spans([first, ChunkSpan(KEY_2, 16, 30), third]) == {first, third}
    assert sorted(t.sha1 for t in index.text_candidates(35)) == [ID_B]
    index.remove(ID_A)
    assert index.has_chunk(KEY_1) and not index.has_chunk(KEY_2) and len(index) == 1
    index.add(_entry(ID_B, (first,)))  # re-adding replaces
    assert not index.has_chunk(KEY_3) and index.users_of(KEY_1) == [ID_B]
