"""The web console: its static page at `/` (HTML/CSS/JS modules in `static/`, no build step, no
CDN) and the JSON API behind it under `/kvserve/v1/`.

The page loads without a key (it holds no data) and asks for one when the API answers 401;
every data route sits behind `--api-key` like the rest of the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from kvserve.api.console.schema import (
    BlockPoolModel,
    CacheResponse,
    CheckpointModel,
    CheckpointSort,
    CheckpointsResponse,
    DiskSummaryModel,
    DivergenceModel,
    HitRatePoint,
    LiveRequestModel,
    RequestRecordModel,
    RequestsResponse,
)
from kvserve.api.errors import ApiError
from kvserve.api.front_end_questions import ConsoleHitRate, ConsoleQuestion, ConsoleRequest, ConsoleRequests
from kvserve.serving.cache_view import CacheView, CacheViewSource, CheckpointView
from kvserve.serving.engine_stats import EngineStatsSource
from kvserve.serving.prompt_divergence import DivergenceFinder
from kvserve.serving.request_recorder import HitRateBucket, LiveRequest, RequestRecord, RequestRecorder

STATIC_DIR = Path(__file__).parent / "static"
STATIC_PREFIX = "/console"

router = APIRouter(prefix="/kvserve/v1", tags=["console"])
page_router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class ConsoleState:
    """With several API front ends (`serve --api-servers`) front end 0's recorder holds every
    finished request: it adds the others' requests in flight (`peer_live`), and the others answer
    the console from it (`ask_primary(question)`, blocking)."""

    recorder: RequestRecorder
    divergences: DivergenceFinder
    cache_view: CacheViewSource | None = None
    engine_stats: EngineStatsSource | None = None
    peer_live: Callable[[], list[LiveRequest]] | None = None
    ask_primary: Callable[[ConsoleQuestion], Any] | None = None


def _state(request: Request) -> ConsoleState:
    return request.app.state.console


@page_router.get("/")
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-cache"})


@router.get("/requests", response_model=RequestsResponse)
async def list_requests(
    request: Request,
    after: int = Query(0, ge=0, description="only requests finished after this seq"),
    limit: int = Query(100, ge=1, le=1000, description="at most this many (the newest)"),
) -> RequestsResponse:
    """Requests in flight (with prefill progress) and recently finished ones (where each prompt
    came from, and where it diverged from the best earlier prefix)."""
    state = _state(request)
    if state.ask_primary is not None:
        found = await run_in_threadpool(state.ask_primary, ConsoleRequests(after, limit))
        return RequestsResponse.model_validate(found)
    live = state.recorder.live()  # on the loop: reads runs
    return await run_in_threadpool(requests_response, state, after, limit, live)


def requests_response(
    state: ConsoleState, after: int, limit: int, live: list[LiveRequest] | None = None
) -> RequestsResponse:
    """/requests, off the loop (`live`: this front end's in flight, when read on its loop)."""
    live = state.recorder.live() if live is None else live
    if state.peer_live is not None:
        live = sorted([*live, *state.peer_live()], key=lambda r: r.started)
    recent = [_record_model(state, r) for r in state.recorder.recent(after, limit)]
    return RequestsResponse(
        in_flight=[LiveRequestModel.model_validate(r) for r in live],
        recent=recent,
        last_seq=state.recorder.last_seq,
    )


@router.get("/requests/{request_id}", response_model=RequestRecordModel)
async def get_request(request_id: str, request: Request) -> RequestRecordModel:
    state = _state(request)
    if state.ask_primary is not None:
        found = await run_in_threadpool(state.ask_primary, ConsoleRequest(request_id))
    else:
        found = await run_in_threadpool(request_model, state, request_id)
    if found is None:
        raise ApiError(404, f"no recent request {request_id!r}", param="request_id", code="not_found")
    return RequestRecordModel.model_validate(found)


def request_model(state: ConsoleState, request_id: str) -> RequestRecordModel | None:
    record = state.recorder.get(request_id)
    return None if record is None else _record_model(state, record)


def _record_model(state: ConsoleState, record: RequestRecord) -> RequestRecordModel:
    model = RequestRecordModel.model_validate(record)
    divergence = state.divergences.find(record)
    model.divergence = None if divergence is None else DivergenceModel.model_validate(divergence)
    return model


@router.get("/cache", response_model=CacheResponse)
async def cache_summary(request: Request) -> CacheResponse:
    """RAM block pool, disk tier totals, and the prompt-token hit rate over time."""
    state = _state(request)
    view = await _cache_view(state)
    stats = state.engine_stats() if state.engine_stats is not None else None
    return CacheResponse(
        pool=None if view is None else BlockPoolModel.model_validate(view.pool),
        disk=None if view is None or view.disk is None else DiskSummaryModel.model_validate(view.disk),
        prefix_cache_hit_rate=None if stats is None else stats.prefix_cache_hit_rate,
        hit_rate_bucket_s=state.recorder.bucket_s,
        hit_rate=[HitRatePoint.model_validate(b) for b in await _hit_rate_series(state)],
    )


_SORT_KEYS = {
    "score": lambda c: c.score,
    "size": lambda c: c.total_bytes,
    "tokens": lambda c: c.num_tokens,
    "hits": lambda c: c.hits,
    "age": lambda c: -c.created,
    "last_used": lambda c: c.last_used,
    "reason": lambda c: c.reason,
}


@router.get("/cache/checkpoints", response_model=CheckpointsResponse)
async def list_checkpoints(
    request: Request,
    sort: CheckpointSort = "score",
    order: Literal["asc", "desc"] = "asc",
    limit: int = Query(200, ge=1, le=10000),
    offset: int = Query(0, ge=0),
) -> CheckpointsResponse:
    """The disk tier's checkpoints with size, hits, age, eviction score and reason (404 without
    a disk tier). By score ascending, the first is the next to be evicted."""
    view = await _cache_view(_state(request))
    if view is None or view.disk is None:
        raise ApiError(404, "this server has no disk KV cache (--no-kv-cache)", code="not_found")
    rows: list[CheckpointView] = sorted(view.disk.checkpoints, key=_SORT_KEYS[sort], reverse=order == "desc")
    now = time.time()
    page = [CheckpointModel.model_validate(c) for c in rows[offset : offset + limit]]
    for model in page:
        model.age_s = max(0.0, now - model.created)
    return CheckpointsResponse(total=len(rows), sort=sort, order=order, checkpoints=page)


async def _hit_rate_series(state: ConsoleState) -> list[HitRateBucket]:
    if state.ask_primary is not None:
        return await run_in_threadpool(state.ask_primary, ConsoleHitRate())
    return state.recorder.hit_rate_series()


async def _cache_view(state: ConsoleState) -> CacheView | None:
    # Off the loop: the disk tier reads its index.
    return None if state.cache_view is None else await run_in_threadpool(state.cache_view)
