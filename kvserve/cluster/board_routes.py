"""What the cluster's ingress answers itself, from the router's board, instead of forwarding to a
replica: the cluster's /metrics and the console's cluster page (`/kvserve/v1/cluster`)."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.responses import Response

from kvserve.api.auth import has_api_key
from kvserve.api.errors import ApiError, error_response
from kvserve.cluster import board
from kvserve.cluster.cluster_metrics import render_metrics
from kvserve.cluster.cluster_view import CLUSTER_PATH, cluster_view

BOARD_PATHS = ("/metrics", CLUSTER_PATH)


def board_response(
    method: str,
    path: str,
    raw_headers: Iterable[tuple[bytes, bytes]],
    api_key: str | None,
    source: board.RoutingBoard | None = None,
) -> Response | None:
    """The reply to a board route (behind the API key, as every replica route is); None for any other
    request, which goes to a replica."""
    if method != "GET" or path not in BOARD_PATHS:
        return None
    if api_key and not has_api_key(raw_headers, api_key.encode()):
        return error_response(path, ApiError(401, "invalid or missing API key"))
    source = source or board.BOARD
    if path == CLUSTER_PATH:
        return Response(cluster_view(source.snapshot()).model_dump_json(), media_type="application/json")
    return Response(render_metrics(source), media_type="text/plain; version=0.0.4; charset=utf-8")
