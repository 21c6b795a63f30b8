"""Concurrent writers on one shared KV tier (a shared directory; a real SeaweedFS bucket): four
processes save overlapping prefixes and load each other's, at once. Nothing is corrupt afterwards:
every manifest decodes, every chunk verifies and holds exactly its tokens' KV, no write is left half
done, and each chunk is stored once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.cli.main import main
from kvserve.kvstore.chunk_format import decode_chunk
from kvserve.kvstore.manifest import decode_manifest
from kvserve.kvstore.shared.keys import chunk_key, manifest_key, parse_key
from kvserve.kvstore.shared.object_store import ObjectStore
from tests.serve_process import REPO, child_env
from tests.unit.kvstore.kvstore_helpers import bits, kv_for, make_identity

# Four interpreters at once: tens of seconds on a loaded 2-core machine.
pytestmark = pytest.mark.slow

NUM_WORKERS = 4
NUM_SAVES = 25


def test_concurrent_writers_never_corrupt_the_shared_tier(
    shared_location: tuple[str, str | None],
    object_store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    location, endpoint = shared_location
    env = child_env(OMP_NUM_THREADS="1")
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.shared_kv.shared_writer_worker",
                location,
                endpoint or "",
                str(tmp_path / f"local{i}"),
                str(i + 1),
                str(NUM_SAVES),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(NUM_WORKERS)
    ]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [w.returncode for w in workers] == [0] * NUM_WORKERS, "\n".join(outputs)

    identity = make_identity()
    keys = [info.key for info in object_store.list("")]
    parsed = [parse_key(key) for key in keys]
    assert None not in parsed, keys  # no temp file or stray object left
    manifests = [p.name for p in parsed if p.kind == "manifest"]
    chunks = {p.name for p in parsed if p.kind == "chunk"}
    assert len(chunks) == len([p for p in parsed if p.kind == "chunk"])
    assert len(manifests) >= NUM_WORKERS
    referenced = set()
    for checkpoint_id in manifests:
        manifest = decode_manifest(object_store.get(manifest_key(identity, checkpoint_id)))
        expected = kv_for(manifest.token_ids, identity)
        for span in manifest.chunks:
            referenced.add(span.key)
            data = object_store.get(chunk_key(identity, span.key))
            assert data is not None, f"{checkpoint_id} names a missing chunk {span.key}"
            tokens, layers = decode_chunk(bytearray(data), identity, span)  # raises if corrupt
            assert tokens == manifest.token_ids[span.start : span.end]
            for got, want in zip(layers, expected, strict=True):
                assert bits(got).equal(bits(want[:, span.start : span.end]))
    # Every chunk belongs to a checkpoint (a writer's chunks go before its manifest, and all finished).
    assert referenced == chunks
    # And the operator's check agrees: `kvserve kv verify` against the shared tier is clean.
    where = (
        ["--kv-shared-dir", location]
        if endpoint is None
        else ["--kv-s3-url", location, "--kv-s3-endpoint", endpoint]
    )
    with pytest.raises(SystemExit) as verified:
        main(["kv", "verify", *where])
    assert verified.value.code == 0, capsys.readouterr().out
