"""FastAPI app factory: one ChatService behind every protocol's routes."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from kvserve import __version__
from kvserve.api import info_routes, metrics
from kvserve.api.access_log import AccessLogMiddleware
from kvserve.api.anthropic_messages import router as anthropic_router
from kvserve.api.auth import ApiKeyMiddleware
from kvserve.api.console import routes as console
from kvserve.api.disconnect import ClientDisconnected
from kvserve.api.errors import install_error_handlers
from kvserve.api.openai_chat import router as chat_router
from kvserve.api.openai_completions import router as completions_router
from kvserve.api.openai_responses import router as responses_router
from kvserve.api.security_headers import SecurityHeadersMiddleware
from kvserve.api.settings import ApiSettings
from kvserve.serving.cache_view import CacheViewSource
from kvserve.serving.chat_service import ChatService
from kvserve.serving.engine_stats import EngineStatsSource
from kvserve.serving.prompt_divergence import CheckpointTokens, DivergenceFinder
from kvserve.serving.response_store import ResponseStore

# Status nginx uses for "client closed request"; nobody reads it, but logs should not say 200 or 500.
_CLIENT_CLOSED = 499


def create_app(
    service: ChatService,
    settings: ApiSettings | None = None,
    response_store: ResponseStore | None = None,
    engine_stats: EngineStatsSource | None = None,
    cache_view: CacheViewSource | None = None,
    checkpoint_tokens: CheckpointTokens | None = None,
) -> FastAPI:
    """`response_store` defaults to an in-memory one (`kvserve serve` passes a persistent one);
    `engine_stats` feeds the engine gauges of /metrics; `cache_view` (RAM pool, disk checkpoints)
    and `checkpoint_tokens` (a checkpoint's exact tokens) feed the web console."""
    settings = settings or ApiSettings()
    app = FastAPI(title="kvserve", version=__version__)
    app.state.chat_service = service
    app.state.settings = settings
    app.state.metrics = metrics.Metrics(engine_stats)
    app.state.response_store = response_store or ResponseStore()
    app.state.console = console.ConsoleState(
        service.recorder,
        DivergenceFinder(service.recorder, lambda ids: service.detokenize(list(ids)), checkpoint_tokens),
        cache_view,
        engine_stats,
    )
    install_error_handlers(app)

    @app.exception_handler(ClientDisconnected)
    async def _disconnected(request: Request, error: ClientDisconnected) -> Response:
        return Response(status_code=_CLIENT_CLOSED)

    for module in (chat_router, completions_router, anthropic_router, responses_router, info_routes, metrics):
        app.include_router(module.router)
    app.include_router(console.router)
    app.include_router(console.page_router)
    app.mount(console.STATIC_PREFIX, StaticFiles(directory=console.STATIC_DIR), name="console")
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    if settings.cors:  # added after auth so it wraps it: preflights and 401s carry CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(SecurityHeadersMiddleware)  # on every response, 401s included
    app.add_middleware(AccessLogMiddleware)  # outermost: every response, 401s included, gets an id
    return app
