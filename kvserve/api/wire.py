"""Base for every wire model: unknown fields are accepted, types are strict ("true" is not a bool)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
