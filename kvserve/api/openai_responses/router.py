"""POST /v1/responses."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvserve.api.body import read_model
from kvserve.api.errors import ApiError
from kvserve.api.generation import chat_service, encode_stream, prepare
from kvserve.api.disconnect import cancel_on_disconnect
from kvserve.api.openai_responses.adapter import to_chat_request, wants_reasoning_summary
from kvserve.api.openai_responses.encoder import ResponsesEncoder
from kvserve.api.openai_responses.schema import ResponsesRequest
from kvserve.api.request_fields import new_id
from kvserve.api.sse import sse_response

router = APIRouter()


@router.post("/v1/responses", response_model=None,
             openapi_extra={"requestBody": {"content": {"application/json": {
                 "schema": ResponsesRequest.model_json_schema()}}, "required": True}})
async def responses(request: Request) -> Response:
    wire = await read_model(request, ResponsesRequest)
    service = chat_service(request)
    prepared = await prepare(lambda chat: service.prepare_chat(chat, param="input"), to_chat_request(wire))
    model = wire.model or request.app.state.settings.served_model_name
    namespaces = frozenset(t.get("name") for t in wire.tools or () if t.get("type") == "namespace")
    encoder = ResponsesEncoder(new_id("resp_"), model, _echo(wire), wants_reasoning_summary(wire), namespaces)
    events = service.generate(prepared)
    if wire.stream:
        return sse_response(encode_stream(encoder, events))

    async def run() -> None:
        async for event in events:
            encoder.encode(event)

    await cancel_on_disconnect(request, run())
    if encoder.status == "failed":
        raise ApiError(500, encoder.error["message"] if encoder.error else "generation failed")
    return JSONResponse(encoder.response())


def _echo(wire: ResponsesRequest) -> dict[str, Any]:
    return {
        "instructions": wire.instructions, "max_output_tokens": wire.max_output_tokens,
        "parallel_tool_calls": wire.parallel_tool_calls if wire.parallel_tool_calls is not None else True,
        "previous_response_id": None,
        "reasoning": {"effort": wire.reasoning.effort if wire.reasoning else None,
                      "summary": wire.reasoning.summary if wire.reasoning else None},
        "store": bool(wire.store) if wire.store is not None else True,
        "temperature": wire.temperature if wire.temperature is not None else 1.0,
        "top_p": wire.top_p if wire.top_p is not None else 1.0,
        "tool_choice": wire.tool_choice if wire.tool_choice is not None else "auto",
        "tools": wire.tools or [],
        "text": wire.text or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": wire.metadata or {},
    }
