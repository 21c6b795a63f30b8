"""Async orchestration between the HTTP adapters and the engine: ChatService and the output pipeline."""
