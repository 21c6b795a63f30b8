"""Model listing, health, HEAD /, tokenize/detokenize."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kvserve.api.body import read_model
from kvserve.api.errors import ApiError
from kvserve.api.generation import chat_service
from kvserve.api.wire import WireModel

router = APIRouter()
_STARTED = int(time.time())


def _model_json(request: Request) -> dict[str, Any]:
    settings = request.app.state.settings
    service = chat_service(request)
    ctx = service.settings.max_model_len
    return {
        "id": settings.served_model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": settings.owned_by,
        "context_length": ctx,
        "max_model_len": ctx,
        # What a request that leaves a sampling parameter out gets, and where each value comes from
        # (--generation-config), like llama-server's /props default_generation_settings.
        "sampling_defaults": service.settings.sampling_defaults.to_json(),
        # Whether requests may carry images (chat/image.py), as llama-server's /props reports it.
        "modalities": {"vision": service.settings.supports_images, "audio": False},
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_json(request)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    if model_id != request.app.state.settings.served_model_name:
        raise ApiError(404, f"model {model_id!r} not found", param="model", code="model_not_found")
    return _model_json(request)


@router.get("/health")
async def health(request: Request) -> Response:
    is_healthy = getattr(chat_service(request).engine, "is_running", True)
    if not is_healthy:
        return JSONResponse({"status": "error", "error": "engine is not running"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.head("/")
@router.head("/api/hello")
async def head_root() -> Response:
    # Connection warm-ups before the first request: Claude Code 2.1.197 probes `HEAD /`, 2.1.332
    # `HEAD /api/hello` (the Anthropic API's preconnect route); neither sends its API key.
    return Response(status_code=200)


class TokenizeRequest(WireModel):
    prompt: str | None = None
    text: str | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(WireModel):
    tokens: list[int]


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    wire = await read_model(request, TokenizeRequest)
    text = wire.prompt if wire.prompt is not None else wire.text
    if text is None:
        raise ApiError(400, "prompt is required", param="prompt")
    service = chat_service(request)
    tokens = await run_in_threadpool(service.tokenize, text, wire.add_special_tokens)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": service.settings.max_model_len}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    wire = await read_model(request, DetokenizeRequest)
    service = chat_service(request)
    vocab_size = len(service.tokenizer.tokenizer)
    if any(t < 0 or t >= vocab_size for t in wire.tokens):
        raise ApiError(400, f"token ids must be in [0, {vocab_size})", param="tokens")
    return {"prompt": await run_in_threadpool(service.detokenize, wire.tokens)}
