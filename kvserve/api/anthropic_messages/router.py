"""POST /v1/messages (also `?beta=true`, as Claude Code sends it) and /v1/messages/count_tokens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kvserve.api.anthropic_messages.adapter import MessagesStreamEncoder, to_chat_request, to_response
from kvserve.api.anthropic_messages.schema import MessagesRequest
from kvserve.api.body import read_model
from kvserve.api.generation import chat_service, complete, encode_stream, generate, prepare, to_chat
from kvserve.api.request_fields import new_id
from kvserve.api.sse import sse_response
from kvserve.serving.tool_continuation import ANTHROPIC

router = APIRouter()
_BODY = {
    "requestBody": {
        "content": {"application/json": {"schema": MessagesRequest.model_json_schema()}},
        "required": True,
    }
}


@router.post("/v1/messages", response_model=None, openapi_extra=_BODY)
async def messages(request: Request) -> Response:
    wire = await read_model(request, MessagesRequest)
    service = chat_service(request)
    chat = await to_chat(request, to_chat_request, wire)
    prepared = await prepare(request, service.prepare_chat, chat, continuation=ANTHROPIC)
    model = wire.model or request.app.state.settings.served_model_name
    message_id = new_id("msg_")
    events = generate(request, prepared)
    if wire.stream:
        return sse_response(encode_stream(MessagesStreamEncoder(message_id, model), events))
    result = await complete(request, events)
    return JSONResponse(to_response(result, message_id, model))


@router.post("/v1/messages/count_tokens", response_model=None, openapi_extra=_BODY)
async def count_tokens(request: Request) -> dict[str, Any]:
    wire = await read_model(request, MessagesRequest)
    service = chat_service(request)
    chat = await to_chat(request, to_chat_request, wire)
    text = await run_in_threadpool(service.render, chat)
    token_ids = await run_in_threadpool(service.tokenize, text, False)
    return {"input_tokens": len(token_ids)}
