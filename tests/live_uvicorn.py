"""uvicorn on a free 127.0.0.1 port in a thread, for tests that need a real socket."""

from kvserve.cli.embedded import serve_in_thread

__all__ = ["serve_in_thread"]
