"""Response models of the console's JSON API (`/kvserve/v1/...`), listed on the OpenAPI page."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["cold", "ram", "disk"]
CheckpointSort = Literal["score", "size", "tokens", "hits", "age", "last_used", "reason"]


class ViewModel(BaseModel):
    """Built from the serving layer's records (`model_validate(record)`): same field names."""

    model_config = ConfigDict(from_attributes=True)


class DivergenceModel(ViewModel):
    """Where the prompt left the most similar earlier prompt (a recent request or the disk
    checkpoint it loaded), with the text on both sides of that token."""

    token_index: int = Field(
        description="first prompt token that differs; the prompt length if it matched whole"
    )
    reference_kind: Literal["request", "checkpoint"]
    reference_id: str
    before: str = Field(description="shared text just before the divergence point")
    after: str = Field(description="this prompt's text from the divergence point")
    reference_after: str = Field(description="the reference's text from the divergence point")


class LiveRequestModel(ViewModel):
    request_id: str
    started: float = Field(description="Unix time")
    elapsed_s: float
    phase: Literal["queued", "prefill", "decode"]
    source: Source
    num_prompt_tokens: int
    num_computed_tokens: int = Field(
        description="prompt tokens in the KV cache so far (cached prefix included)"
    )
    num_cached_tokens: int
    num_disk_tokens: int
    num_output_tokens: int


class RequestRecordModel(ViewModel):
    seq: int = Field(description="order of finishing; pass the last one seen as `after`")
    request_id: str
    started: float = Field(description="Unix time")
    source: Source = Field(description="where the cached prefix came from: cold (none), ram, disk")
    num_prompt_tokens: int
    num_cached_tokens: int = Field(description="prompt tokens served from the cache (RAM + disk)")
    num_disk_tokens: int = Field(description="of those, loaded from a disk checkpoint")
    checkpoint_id: str | None
    num_output_tokens: int
    ttft_s: float | None
    duration_s: float
    decode_tokens_per_s: float
    outcome: Literal["stop", "length", "aborted"]
    divergence: DivergenceModel | None = None


class RequestsResponse(BaseModel):
    in_flight: list[LiveRequestModel]
    recent: list[RequestRecordModel] = Field(description="finished after `after`, oldest first")
    last_seq: int


class HitRatePoint(ViewModel):
    start: float = Field(description="Unix time the bucket starts")
    num_requests: int
    num_prompt_tokens: int
    num_cached_tokens: int
    hit_rate: float = Field(description="cached / prompt tokens")


class BlockPoolModel(ViewModel):
    block_size: int
    num_blocks: int
    num_used_blocks: int = Field(description="held by requests in flight")
    num_cached_blocks: int = Field(description="holding a cached prefix (in use or reusable)")
    num_free_blocks: int
    num_touched_blocks: int = Field(0, description="ever handed out: on CPU the resident part of the pool")
    block_bytes: int = Field(0, description="KV bytes of one block, all layers")


class DiskSummaryModel(ViewModel):
    directory: str
    budget_bytes: int
    num_bytes: int
    num_checkpoints: int


class CacheResponse(BaseModel):
    pool: BlockPoolModel | None = Field(description="None when the server has no engine stats")
    disk: DiskSummaryModel | None = Field(description="None without the disk tier")
    prefix_cache_hit_rate: float | None = Field(description="RAM prefix-cache hit rate since start")
    hit_rate_bucket_s: float
    hit_rate: list[HitRatePoint] = Field(description="prompt-token hit rate of finished requests over time")


class CheckpointModel(ViewModel):
    checkpoint_id: str
    reason: str
    num_tokens: int
    total_bytes: int
    marginal_bytes: int = Field(description="what deleting it would free")
    hits: int
    effective_hits: float
    created: float
    last_used: float
    age_s: float = Field(0.0, description="seconds since it was created")
    score: float = Field(description="eviction score; the lowest is evicted first")


class CheckpointsResponse(BaseModel):
    total: int
    sort: CheckpointSort
    order: Literal["asc", "desc"]
    checkpoints: list[CheckpointModel]
