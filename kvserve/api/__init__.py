"""HTTP layer: FastAPI routes per protocol, pydantic wire models, SSE. No torch, no engine internals."""
