"""The cluster's ingress (a light Ray Serve deployment behind Ray's HTTP proxy): it reads the body
once, takes the routing keys from it (`routing_keys`), and forwards the request to the replicas'
deployment through a streaming `DeploymentHandle`, whose router (`ray_router`) sees those keys as the
call's first argument. Its reply streams back chunk by chunk. A replica that dies before answering
is retried on another; one that dies mid-stream ends the stream with the protocol's error."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvserve.api.body import read_body
from kvserve.api.errors import ApiError, error_response
from kvserve.cluster import board
from kvserve.cluster.asgi_bridge import ForwardedRequest, ReplyHead
from kvserve.cluster.board_routes import board_response
from kvserve.cluster.routing_keys import RoutingKeys, extract_routing_keys
from kvserve.cluster.stream_failure import failure_frames

logger = logging.getLogger(__name__)

REPLICA_HEADER = b"x-kvserve-replica"
# A replica that dies before its first byte: the request is sent again, to a live one, this many times.
_MAX_ATTEMPTS = 3
# With no replica up (all died, none started yet) Ray's router would hold a request until one is:
# after this long without any, the request gets a 503 instead of waiting on.
NO_REPLICA_TIMEOUT_S = 30.0


class _NoReplica(Exception):
    pass


@dataclass(frozen=True)
class IngressSettings:
    max_body_bytes: int = 64 * 2**20
    api_key: str | None = None  # the replicas check it on their routes; the ingress on its /metrics


class ClusterIngress:
    def __init__(self, replicas: DeploymentHandle, settings: IngressSettings) -> None:
        self.replicas = replicas.options(method_name="forward", stream=True)
        self.settings = settings

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        own = board_response(request.method, path, request.headers.raw, self.settings.api_key)
        if own is not None:
            return own
        try:
            body = await read_body(request, self.settings.max_body_bytes)
        except ApiError as error:
            return error_response(path, error)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers.raw}
        client = (request.client.host, request.client.port) if request.client else None
        keys = extract_routing_keys(request.method, path, headers, body, client[0] if client else None)
        forwarded = ForwardedRequest(
            request.method, path, request.url.query.encode(), tuple(request.headers.raw), body, client
        )
        return await self._forward(keys, forwarded)

    async def _forward(self, keys: RoutingKeys, request: ForwardedRequest) -> Response:
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            stream: DeploymentResponseGenerator = self.replicas.remote(keys, request)
            try:
                head = await _first_piece(stream)
            except asyncio.CancelledError:  # the client left before the reply began (a long prefill)
                stream.cancel()
                raise
            except _NoReplica:
                stream.cancel()
                break
            except (RayActorError, ActorUnavailableError) as error:
                stream.cancel()
                logger.warning(
                    "%s %s: replica failed before answering (attempt %d): %s",
                    request.method,
                    request.path,
                    attempt,
                    error,
                )
                continue
            except (RayError, StopAsyncIteration) as error:
                stream.cancel()
                logger.error("%s %s: replica error: %s", request.method, request.path, error)
                return error_response(
                    request.path, ApiError(502, f"the replica failed: {type(error).__name__}")
                )
            assert isinstance(head, ReplyHead)
            response = StreamingResponse(_body(stream, request.path, head), status_code=head.status)
            # Which replica answered: for logs, the console's user and the kill test.
            response.raw_headers = [*head.headers, (REPLICA_HEADER, head.replica_tag.encode())]
            return response
        return error_response(request.path, ApiError(503, "no kvserve replica could take the request"))


async def _first_piece(stream: DeploymentResponseGenerator) -> ReplyHead:
    """The reply's head; however long a replica takes to send it (a non-streamed answer comes whole),
    but not while there is no replica at all for NO_REPLICA_TIMEOUT_S."""
    task = asyncio.ensure_future(stream.__anext__())
    # Cancelled below when the client left: its RequestCancelledError is expected, not worth a log.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return task.result()
            if board.BOARD.seconds_without_replicas(time.time()) > NO_REPLICA_TIMEOUT_S:
                raise _NoReplica()
    finally:
        task.cancel()


async def _body(stream: DeploymentResponseGenerator, path: str, head: ReplyHead) -> AsyncIterator[bytes]:
    is_sse = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in head.headers)
    finished = False
    try:
        async for chunk in stream:
            yield chunk
        finished = True
    except RayError as error:
        logger.warning("%s: replica %s failed mid-answer: %s", path, head.replica_tag, type(error).__name__)
        if is_sse:
            message = f"the kvserve replica serving this request failed ({type(error).__name__}); retry"
            for frame in failure_frames(path, message):
                yield frame.encode()
        # A JSON body is cut short: its content-length makes the client's read fail at once.
        finished = True
    finally:
        if not finished:  # the client went away: cancel the request on its replica
            stream.cancel()
