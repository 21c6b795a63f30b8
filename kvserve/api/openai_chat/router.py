"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvserve.api.body import read_model
from kvserve.api.generation import chat_service, complete, encode_stream, generate, prepare, to_chat
from kvserve.api.openai_chat.adapter import ChatStreamEncoder, to_chat_request, to_response
from kvserve.api.openai_chat.schema import ChatCompletionRequest
from kvserve.api.request_fields import new_id
from kvserve.api.sse import sse_response

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}},
            "required": True,
        }
    },
)
async def chat_completions(request: Request) -> Response:
    wire = await read_model(request, ChatCompletionRequest)
    service = chat_service(request)
    chat = await to_chat(request, to_chat_request, wire)
    prepared = await prepare(request, service.prepare_chat, chat)
    model = wire.model or request.app.state.settings.served_model_name
    completion_id = new_id("chatcmpl-")
    events = generate(request, prepared)
    if wire.stream:
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        return sse_response(encode_stream(ChatStreamEncoder(completion_id, model, include_usage), events))
    result = await complete(request, events)
    return JSONResponse(to_response(result, completion_id, model, logprobs=bool(wire.logprobs)))
