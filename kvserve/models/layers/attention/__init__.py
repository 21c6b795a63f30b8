"""Paged attention: per-batch metadata, the backend interface, and the torch reference backend."""

from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.attention.metadata import (
    AttentionMetadata,
    forward_context,
    get_attention_metadata,
)
from kvserve.models.layers.attention.torch_ref import TorchRefBackend

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchRefBackend",
    "forward_context",
    "get_attention_metadata",
]
