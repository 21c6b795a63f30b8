"""Read and validate a request body: size limit (413), strict JSON, pydantic wire model (400)."""

from __future__ import annotations

from typing import TypeVar

import anyio
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from kvserve.api.disconnect import ClientDisconnected
from kvserve.api.errors import ApiError, validation_message
from kvserve.api.json_body import parse_json_body

M = TypeVar("M", bound=BaseModel)
# A body that stops arriving this long (a slowloris body, a client gone without a FIN) ends in a 408
# instead of holding its connection and task for ever; the head has its own deadline (http_server.py).
BODY_IDLE_TIMEOUT_S = 30.0


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is larger than {limit} bytes")
    chunks, size = [], 0
    stream = request.stream()
    while True:
        with anyio.move_on_after(BODY_IDLE_TIMEOUT_S) as waited:
            try:
                chunk = await anext(stream, None)
            except ClientDisconnect:
                # Gone mid-body: answered like any disconnect (499 in the access log), not as a 500
                # with a traceback (10,000 dropped uploads logged 300K lines).
                raise ClientDisconnected() from None
        if waited.cancelled_caught:
            raise ApiError(408, f"no part of the request body arrived for {BODY_IDLE_TIMEOUT_S:.0f} s")
        if chunk is None:
            break
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_model(request: Request, model: type[M]) -> M:
    data = parse_json_body(await read_body(request, request.app.state.settings.max_body_bytes))
    try:
        return model.model_validate(data)
    except ValidationError as error:
        message, param = validation_message(error)
        raise ApiError(400, message, param=param) from None
