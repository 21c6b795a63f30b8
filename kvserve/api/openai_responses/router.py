"""POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kvserve.api.body import read_model
from kvserve.api.disconnect import cancel_on_disconnect
from kvserve.api.errors import ApiError
from kvserve.api.generation import chat_service, encode_stream, generate, prepare, to_chat
from kvserve.api.openai_responses.adapter import conversation, to_chat_request, wants_reasoning_summary
from kvserve.api.openai_responses.encoder import ResponsesEncoder
from kvserve.api.openai_responses.schema import ResponsesRequest
from kvserve.api.request_fields import new_id
from kvserve.api.sse import sse_response
from kvserve.chat.conversation import Message
from kvserve.serving.response_store import ResponseStore, StoredResponse
from kvserve.serving.tool_continuation import RESPONSES

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    return request.app.state.response_store


@router.post(
    "/v1/responses",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": ResponsesRequest.model_json_schema()}},
            "required": True,
        }
    },
)
async def responses(request: Request) -> Response:
    wire = await read_model(request, ResponsesRequest)
    chat = await to_chat(request, to_chat_request, wire, await _previous(request, wire.previous_response_id))
    service = chat_service(request)
    prepared = await prepare(request, service.prepare_chat, chat, param="input", continuation=RESPONSES)
    model = wire.model or request.app.state.settings.served_model_name
    echo = _echo(wire, service.settings.sampling_defaults.values())
    encoder = ResponsesEncoder(
        new_id(request.app.state.settings.response_id_prefix),
        model,
        echo,
        wants_reasoning_summary(wire),
        chat.tools,
    )
    events = generate(request, prepared)
    history = conversation(wire, chat)
    if wire.stream:
        return sse_response(_stream_then_store(request, encoder, events, history, wire.store is not False))

    async def run() -> None:
        async for event in events:
            encoder.encode(event)

    await cancel_on_disconnect(request, run())
    if encoder.status == "failed":
        raise ApiError(500, encoder.error["message"] if encoder.error else "generation failed")
    if wire.store is not False:
        await _save(request, encoder, history)
    return JSONResponse(encoder.response())


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    stored = await run_in_threadpool(_store(request).lookup, response_id)
    if stored is None:
        raise ApiError(
            404, f"No response found with id '{response_id}'.", param="response_id", code="not_found"
        )
    return stored.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not await run_in_threadpool(_store(request).delete, response_id):
        raise ApiError(
            404, f"No response found with id '{response_id}'.", param="response_id", code="not_found"
        )
    return {"id": response_id, "object": "response", "deleted": True}


async def _previous(request: Request, response_id: str | None) -> tuple[Message, ...]:
    if response_id is None:
        return ()
    stored = await run_in_threadpool(_store(request).lookup, response_id)
    if stored is None:
        raise ApiError(
            400,
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.messages


async def _stream_then_store(
    request: Request,
    encoder: ResponsesEncoder,
    events: AsyncIterator[Any],
    history: tuple[Message, ...],
    store: bool,
) -> AsyncIterator[str]:
    async for frame in encode_stream(encoder, events):
        yield frame
    if store and encoder.status in ("completed", "incomplete"):
        await _save(request, encoder, history)


async def _save(request: Request, encoder: ResponsesEncoder, history: tuple[Message, ...]) -> None:
    stored = StoredResponse(encoder.response(), (*history, encoder.output_message()))
    await run_in_threadpool(_store(request).save, encoder.response_id, stored)


def _echo(wire: ResponsesRequest, defaults: dict[str, float | int]) -> dict[str, Any]:
    """The request's settings as the response object reports them (the server's defaults filled in)."""
    return {
        "instructions": wire.instructions,
        "max_output_tokens": wire.max_output_tokens,
        "parallel_tool_calls": wire.parallel_tool_calls if wire.parallel_tool_calls is not None else True,
        "previous_response_id": wire.previous_response_id,
        "reasoning": {
            "effort": wire.reasoning.effort if wire.reasoning else None,
            "summary": wire.reasoning.summary if wire.reasoning else None,
        },
        "store": wire.store is not False,
        "temperature": wire.temperature if wire.temperature is not None else defaults["temperature"],
        "top_p": wire.top_p if wire.top_p is not None else defaults["top_p"],
        "tool_choice": wire.tool_choice if wire.tool_choice is not None else "auto",
        "tools": wire.tools or [],
        "text": wire.text or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": wire.metadata or {},
    }
