"""S3ObjectStore: the shared tier in an S3-compatible bucket (AWS S3, SeaweedFS, MinIO, Ceph RGW),
through boto3.

Credentials, region and endpoint come from boto3's usual sources (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
~/.aws, an instance role); `endpoint_url` overrides the endpoint. Each object is one PUT, which S3
makes visible whole or not at all; `If-None-Match: *` (S3's conditional write, supported by AWS
since 2024 and by SeaweedFS and MinIO) makes the first writer win. A server that does not implement
it answers 501, and the store then checks with HEAD first: the race left is two writers of one
content-addressed key, whose bytes are the same.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from kvserve.kvstore.shared.object_store import ObjectInfo, ObjectStoreError

# Connection and read timeouts bound every call: a stalled store makes a lookup miss or a publish
# fail, never a request hang.
_CONNECT_TIMEOUT_S = 5
_READ_TIMEOUT_S = 30


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes at its ends) of `s3://bucket[/prefix]`."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3://bucket[/prefix] URL: {url!r}")
    return parsed.netloc, parsed.path.strip("/")


class S3ObjectStore:
    def __init__(self, url: str, endpoint_url: str | None = None) -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = parse_s3_url(url)
        self._url = url
        config = Config(
            connect_timeout=_CONNECT_TIMEOUT_S,
            read_timeout=_READ_TIMEOUT_S,
            retries={"max_attempts": 3, "mode": "standard"},
            # Path-style requests work with every S3-compatible server; virtual hosts need DNS.
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        session = boto3.session.Session()
        self._client: Any = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=session.region_name or "us-east-1",
            config=config,
        )
        self.endpoint_url = self._client.meta.endpoint_url
        self._conditional_put = True  # until the server answers 501 to If-None-Match
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._url

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def check(self) -> None:
        """Raise ObjectStoreError if the bucket cannot be reached (at start-up: say so at once)."""
        self._call("head_bucket", Bucket=self.bucket)

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, operation)(**kwargs)
        except ClientError as error:
            raise _S3Error.of(error) from error
        except BotoCoreError as error:  # connection refused, timeouts, bad credentials config
            raise ObjectStoreError(f"s3 {operation} on {self._url}: {error}") from error

    def put_if_absent(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        if not self._conditional_put:
            if self._exists(full):
                return False
            self._call("put_object", Bucket=self.bucket, Key=full, Body=data)
            return True
        if self._exists(full):  # a HEAD costs less than sending the bytes to hear 412
            return False
        try:
            self._call("put_object", Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            return True
        except _S3Error as error:
            # 412: it exists. 409: another writer's conditional PUT of it is in flight (AWS).
            if error.status in (409, 412):
                return False
            if error.status != 501:
                raise
        with self._lock:
            self._conditional_put = False
        return self.put_if_absent(key, data)

    def _exists(self, full_key: str) -> bool:
        try:
            self._call("head_object", Bucket=self.bucket, Key=full_key)
            return True
        except _S3Error as error:
            if error.status == 404:
                return False
            raise

    def get(self, key: str) -> bytes | None:
        try:
            response = self._call("get_object", Bucket=self.bucket, Key=self._key(key))
        except _S3Error as error:
            if error.status == 404:
                return None
            raise
        try:
            return response["Body"].read()
        except Exception as error:  # a connection reset mid-body: botocore raises several types
            raise ObjectStoreError(f"s3 get {key} on {self._url}: {error}") from error

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for item in page.get("Contents", ()):
                    modified = item["LastModified"].timestamp()
                    yield ObjectInfo(item["Key"][strip:], int(item["Size"]), modified)
        except ClientError as error:
            raise _S3Error.of(error) from error
        except BotoCoreError as error:
            raise ObjectStoreError(f"s3 list on {self._url}: {error}") from error

    def delete(self, key: str) -> None:
        self._call("delete_object", Bucket=self.bucket, Key=self._key(key))


class _S3Error(ObjectStoreError):
    status: int = 0

    @classmethod
    def of(cls, error: Any) -> _S3Error:
        response = error.response
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = response.get("Error", {}).get("Code", "")
        made = cls(f"s3: {code or status}: {error}")
        made.status = 404 if code in ("NoSuchKey", "NotFound", "404") else status
        return made
