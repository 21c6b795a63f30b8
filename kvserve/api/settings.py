"""HTTP server settings (from `kvserve serve` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.chat.image_limits import ImageLimits


@dataclass(frozen=True)
class ApiSettings:
    served_model_name: str = "kvserve"
    api_key: str | None = None  # checked on every route except /health and HEAD /
    cors: bool = False
    max_body_bytes: int = 64 * 2**20
    owned_by: str = "kvserve"
    image_limits: ImageLimits = field(default_factory=ImageLimits)  # what every request's images may be
    # A cluster replica names itself in the Responses ids it mints (`resp_<tag>_…`), so that the router
    # sends a `previous_response_id` to the replica that stored it (kvserve/cluster/routing_keys.py).
    response_id_prefix: str = "resp_"
