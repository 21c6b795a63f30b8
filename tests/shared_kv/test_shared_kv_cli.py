"""`kvserve kv` against the shared tier (a shared directory; a real SeaweedFS bucket): ls and show
read it, verify finds a corrupt object and --fix removes it, prune and rm delete nothing younger
than --grace and never a chunk another checkpoint still uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvserve.cli.main import main
from kvserve.kvstore.shared.keys import chunks_prefix, manifests_prefix
from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.shared.tier import SharedTier
from tests.unit.kvstore.kvstore_helpers import CHUNK_TOKENS, make_identity, open_store, random_tokens, save


def _kv(capsys: pytest.CaptureFixture[str], location: tuple[str, str | None], *args: str) -> tuple[int, str]:
    where = ["--kv-shared-dir", location[0]] if location[1] is None else ["--kv-s3-url", *location]
    if location[1] is not None:
        where.insert(2, "--kv-s3-endpoint")
    with pytest.raises(SystemExit) as exit_info:
        main(["kv", *args, *where])
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out + err


@pytest.fixture()
def published(object_store: ObjectStore, tmp_path: Path) -> dict[str, list[int]]:
    """Two checkpoints sharing their first two chunks, published by two replicas."""
    common = random_tokens(32, seed=1)
    found = {}
    for name, seed in (("a", 2), ("b", 3)):
        local = open_store(tmp_path / name)
        tokens = common + random_tokens(16, seed=seed)
        result = save(local, tokens)
        tier = SharedTier(object_store, make_identity(), chunk_tokens=CHUNK_TOKENS, background=False)
        assert tier.publish_now(local, result.checkpoint_id)
        found[name] = result.checkpoint_id
    return found


def _count(store: ObjectStore, prefix: str) -> int:
    return len(list(store.list(prefix)))


def test_ls_and_show_read_the_shared_tier(shared_location, published, capsys) -> None:
    status, out = _kv(capsys, shared_location, "ls", "--json")
    assert status == 0, out
    document = json.loads(out)
    assert sorted(c["id"] for c in document["checkpoints"]) == sorted(published.values())
    assert document["totals"]["num_unique_chunks"] == 4 and document["totals"]["dedup_ratio"] > 1.0
    status, out = _kv(capsys, shared_location, "show", published["a"][:10], "--json")
    assert status == 0 and json.loads(out)["num_chunks"] == 3


def test_verify_finds_a_corrupt_chunk_and_fix_removes_it(
    shared_location, object_store, published, capsys
) -> None:
    assert _kv(capsys, shared_location, "verify")[0] == 0
    identity = make_identity()
    key = min(info.key for info in object_store.list(chunks_prefix(identity)))
    data = bytearray(object_store.get(key))
    data[-1] ^= 0xFF
    object_store.delete(key)
    object_store.put_if_absent(key, bytes(data))
    status, out = _kv(capsys, shared_location, "verify")
    assert status == 1 and "corrupt" in out
    status, out = _kv(capsys, shared_location, "verify", "--fix")
    assert status == 0, out
    assert object_store.get(key) is None
    status, out = _kv(capsys, shared_location, "verify")
    # What is left verifies: no corrupt row (an orphan younger than --grace may remain).
    assert status == 0 or not re.search(r"^\W*corrupt\b", out, re.MULTILINE), out


def test_prune_keeps_what_is_younger_than_the_grace_and_shared_chunks(
    shared_location, object_store, published, capsys
) -> None:
    identity = make_identity()
    status, out = _kv(capsys, shared_location, "prune", "--budget-mb", "0")
    assert status == 1 and "--grace" in out  # everything was just written
    assert _count(object_store, manifests_prefix(identity)) == 2
    status, out = _kv(capsys, shared_location, "rm", published["a"], "--grace", "0s")
    assert status == 0, out
    assert _count(object_store, manifests_prefix(identity)) == 1
    # a's own chunk is gone; the two it shared with b stay.
    assert _count(object_store, chunks_prefix(identity)) == 3
    status, out = _kv(capsys, shared_location, "verify")
    assert status == 0, out
