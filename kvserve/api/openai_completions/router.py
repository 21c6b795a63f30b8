"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvserve.api.body import read_model
from kvserve.api.generation import chat_service, complete, encode_stream, generate, prepare
from kvserve.api.openai_completions.adapter import CompletionStreamEncoder, to_response, to_text_request
from kvserve.api.openai_completions.schema import CompletionRequest
from kvserve.api.request_fields import new_id
from kvserve.api.sse import sse_response

router = APIRouter()


@router.post(
    "/v1/completions",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": CompletionRequest.model_json_schema()}},
            "required": True,
        }
    },
)
async def completions(request: Request) -> Response:
    wire = await read_model(request, CompletionRequest)
    service = chat_service(request)
    prepared = await prepare(request, service.prepare_text, to_text_request(wire))
    model = wire.model or request.app.state.settings.served_model_name
    completion_id = new_id("cmpl-")
    events = generate(request, prepared)
    if wire.stream:
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        return sse_response(
            encode_stream(CompletionStreamEncoder(completion_id, model, include_usage), events)
        )
    result = await complete(request, events)
    return JSONResponse(to_response(result, completion_id, model, logprobs=wire.logprobs is not None))
