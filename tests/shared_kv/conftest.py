"""The shared KV tier's backends as fixtures: a shared directory, and a bucket on a real SeaweedFS
S3 server (one per test module; each test gets its own key prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.shared.open_store import open_object_store
from tests.seaweedfs import CREDENTIALS, seaweedfs_s3


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)  # boto3 in this process and the servers it starts
        with seaweedfs_s3(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
            yield endpoint


@pytest.fixture(params=["dir", "s3"])
def shared_location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(location, endpoint) of an empty shared tier: a directory, or a fresh prefix of the bucket."""
    if request.param == "dir":
        return str(tmp_path / "shared"), None
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://kvserve-test/{request.node.name.replace('[', '-').rstrip(']')}", endpoint


@pytest.fixture()
def object_store(shared_location: tuple[str, str | None]) -> ObjectStore:
    return open_object_store(*shared_location)
