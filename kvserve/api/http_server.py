"""The uvicorn settings every kvserve front end runs with, and the HTTP/1.1 protocol that bounds what a
client can hold before its request reaches the app.

uvicorn's httptools protocol (0.55) has no deadline for a request head and no bound on its size: a
client that sends a header byte every few seconds (slowloris) holds its connection forever, and
httptools accumulates an endless header value in memory. `GuardedHttpToolsProtocol` adds both, as
nginx's `client_header_timeout` and `large_client_header_buffers` do: a request head must arrive within
`HEAD_TIMEOUT_S` of its first byte (of the connection, for the first request) and fit in
`MAX_HEAD_BYTES`, else 408 / 431 and the connection is closed. Keep-alive idling between requests stays
uvicorn's own timeout. It also offers the app `sse.ABORT_CONNECTION`: a stream whose client stopped
reading is dropped with its unsent bytes (a plain close waits for them to drain, which never happens).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvserve.api.sse import ABORT_CONNECTION

HEAD_TIMEOUT_S = 10.0
# Agents send 1-2 KB of headers; Node and h11 stop at 16 KiB, nginx at 4 x 8 KiB lines.
MAX_HEAD_BYTES = 64 * 1024


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Checked after parsing: bytes that completed the head (and a body behind it) never count.
        if self._awaiting_head and self._head_bytes > MAX_HEAD_BYTES:
            self._reject(431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {ABORT_CONNECTION: self._abort_connection}
        self._awaiting_head = True
        self._arm_head_timer()

    def _abort_connection(self) -> None:
        self.transport.abort()  # also when already closing: it drops what is still waiting to drain

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head:
            self._reject(408, "Request Timeout", f"request head not received within {HEAD_TIMEOUT_S:.0f} s")

    def _reject(self, status: int, reason: str, message: str) -> None:
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        body = message.encode("ascii")
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def server_config(app: Any, host: str, port: int, log_level: int | str) -> uvicorn.Config:
    """uvicorn's config for a kvserve front end (kvserve.access logs each request, with its id)."""
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, http=GuardedHttpToolsProtocol
    )
