"""Hostile clients against a running server: each case tries one kind of abuse many times and counts
how the server answered (a status class, or the connection closed). The verdict wants only 4xx or
closed connections (a 2xx where the input is still a valid request, e.g. invalid UTF-8 read as U+FFFD),
never a 5xx or a hang, and a server that still answers a plain request afterwards.

Raw sockets (asyncio streams) where HTTP clients would refuse to misbehave: slow readers, slowloris
heads, connection churn, oversized heads; httpx for the bodies.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

INVALID_UTF8 = (
    b"\xff\xfe\xc3(\xed\xa0\x80 \xe2\x82"  # stray bytes, a broken pair, a surrogate, a cut-off char
)


@dataclass
class CaseResult:
    name: str
    num_tried: int = 0
    answers: Counter[str] = field(default_factory=Counter)  # "200", "413", "closed", "open", "timeout"
    seconds: float = 0.0
    note: str = ""

    @property
    def num_5xx(self) -> int:
        return sum(n for k, n in self.answers.items() if k.isdigit() and int(k) >= 500)

    @property
    def num_hung(self) -> int:
        return self.answers["timeout"] + self.answers["open"]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tried": self.num_tried,
            "answers": dict(self.answers),
            "seconds": round(self.seconds, 2),
            "note": self.note,
        }


@dataclass(frozen=True)
class Target:
    base_url: str

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urlsplit(self.base_url).port or 80


def chat_body(content: str = "Hi", *, stream: bool = False, max_tokens: int = 1) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


# One valid body per API, with a string in every field a client may send; `invalid_utf8_bodies` breaks
# each string in turn.
BASE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "m",
        "max_tokens": 1,
        "user": "u",
        "stop": ["s"],
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "t"}], "name": "n"},
            {
                "role": "assistant",
                "content": "a",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
            }
        ],
    },
    "/v1/responses": {
        "model": "m",
        "max_output_tokens": 16,
        "instructions": "i",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "t"}]}],
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
    },
    "/v1/messages": {
        "model": "m",
        "max_tokens": 1,
        "system": "s",
        "stop_sequences": ["x"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "t"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"k": "v"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]},
        ],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    },
    "/v1/completions": {"model": "m", "prompt": "p", "max_tokens": 1, "stop": "s", "suffix": "x"},
}


def invalid_utf8_bodies(body: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    """(JSON path, raw body) with one string value, then one key, replaced by invalid UTF-8 bytes."""
    marker = "\x00KVSERVE-BAD\x00"
    for path, mutated in _each_string(body, marker):
        raw = json.dumps(mutated, ensure_ascii=False).encode()
        yield path, raw.replace(json.dumps(marker).encode(), b'"' + INVALID_UTF8 + b'"')


def _each_string(value: Any, marker: str, path: str = "$") -> Iterator[tuple[str, Any]]:
    if isinstance(value, str):
        yield path, marker
    elif isinstance(value, dict):
        for key, child in value.items():
            for sub_path, sub in _each_string(child, marker, f"{path}.{key}"):
                yield sub_path, {**value, key: sub}
            renamed = {(marker if k == key else k): v for k, v in value.items()}
            yield f"{path}.<key {key}>", renamed
    elif isinstance(value, list):
        for i, child in enumerate(value):
            for sub_path, sub in _each_string(child, marker, f"{path}[{i}]"):
                yield sub_path, [*value[:i], sub, *value[i + 1 :]]


def deep_bodies() -> list[tuple[str, bytes]]:
    """Nesting far past the 256 limit, and just past it inside a field the schema accepts."""
    inner: Any = "x"
    for _ in range(300):
        inner = {"a": inner}
    within = json.dumps(
        {**chat_body(), "tools": [{"type": "function", "function": {"name": "f", "parameters": inner}}]}
    )
    return [
        ("100k arrays", b"[" * 100_000 + b"]" * 100_000),
        ("100k open objects", b'{"a":' * 100_000),
        ("1M unclosed arrays", b"[" * 1_000_000),
        ("300 deep in a tool schema", within.encode()),
    ]


async def _http_answer(send: Awaitable[httpx.Response]) -> str:
    try:
        return str((await send).status_code)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.TransportError:
        return "closed"


async def _post_all(
    http: httpx.AsyncClient, result: CaseResult, posts: list[tuple[str, bytes]]
) -> CaseResult:
    """POST every (url, raw JSON body), `concurrency` at a time (the engine batches what it accepts)."""
    headers = {"content-type": "application/json"}
    gate = asyncio.Semaphore(16)

    async def one(url: str, raw: bytes) -> str:
        async with gate:
            return await _http_answer(http.post(url, content=raw, headers=headers))

    started = time.monotonic()
    for answer in await asyncio.gather(*(one(url, raw) for url, raw in posts)):
        result.answers[answer] += 1
    result.num_tried = len(posts)
    result.seconds = time.monotonic() - started
    return result


async def invalid_utf8_case(http: httpx.AsyncClient, target: Target) -> CaseResult:
    result = CaseResult("invalid UTF-8 in every string field")
    result.note = "invalid bytes are read as U+FFFD (json_body.py): a 200 is the request answered"
    posts = [
        (target.base_url + route, raw)
        for route, body in BASE_BODIES.items()
        for _, raw in invalid_utf8_bodies(body)
    ]
    return await _post_all(http, result, posts)


async def deep_nesting_case(http: httpx.AsyncClient, target: Target) -> CaseResult:
    routes = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
    posts = [(target.base_url + route, raw) for route in routes for _, raw in deep_bodies()]
    return await _post_all(http, CaseResult("deep JSON nesting"), posts)


async def oversized_body_case(http: httpx.AsyncClient, target: Target, limit_bytes: int) -> CaseResult:
    """Declared too large (answered before it is read), and streamed past the limit without a length."""
    result = CaseResult("oversized bodies")
    url = target.base_url + "/v1/chat/completions"
    declared = {"content-type": "application/json", "content-length": str(limit_bytes + 1)}
    for _ in range(4):
        result.num_tried += 1
        result.answers[await _raw_request(target, "POST", "/v1/chat/completions", declared, b"{")] += 1

    async def chunks() -> Any:
        yield b'{"messages": [{"role": "user", "content": "'
        piece = b"a" * (1 << 20)
        for _ in range(limit_bytes // len(piece) + 2):
            yield piece

    for _ in range(2):
        result.num_tried += 1
        answer = await _http_answer(
            http.post(url, content=chunks(), headers={"content-type": "application/json"})
        )
        result.answers[answer] += 1
    return result


async def oversized_head_case(target: Target) -> CaseResult:
    result = CaseResult("oversized headers")
    heads = [
        {"x-big": "a" * (1 << 20)},  # one 1 MiB header
        {f"x-h{i}": "v" for i in range(20_000)},  # 20,000 headers
    ]
    for headers in heads:
        for _ in range(3):
            result.num_tried += 1
            result.answers[await _raw_request(target, "GET", "/health", headers, b"")] += 1
    for _ in range(3):  # a 1 MiB request target
        result.num_tried += 1
        result.answers[await _raw_request(target, "GET", "/health?" + "a" * (1 << 20), {}, b"")] += 1
    return result


async def _raw_request(target: Target, method: str, path: str, headers: dict[str, str], body: bytes) -> str:
    """Write a request as is; the status of the answer, or "closed"."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), 10)
    except OSError:
        return "refused"
    try:
        head = f"{method} {path} HTTP/1.1\r\nhost: {target.host}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        writer.write(head.encode() + b"\r\n" + body)
        try:
            await writer.drain()
        except ConnectionError:
            pass  # the server closed while we wrote: read what it said
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
        except TimeoutError:
            return "timeout"
        except ConnectionError:
            return "closed"
        parts = line.split()
        return parts[1].decode() if len(parts) >= 2 and line.startswith(b"HTTP/") else "closed"
    finally:
        writer.close()


async def slowloris_case(target: Target, num_connections: int, give_up_s: float) -> CaseResult:
    """Connections that send a request head one byte a second: each must be answered/closed by the
    server before `give_up_s`."""
    result = CaseResult("slowloris heads", num_tried=num_connections)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-slow: "

    async def one() -> str:
        try:
            reader, writer = await asyncio.open_connection(target.host, target.port)
        except OSError:
            return "refused"
        try:
            writer.write(head)
            deadline = time.monotonic() + give_up_s
            while time.monotonic() < deadline:
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                except TimeoutError:
                    writer.write(b"a")
                    try:
                        await writer.drain()
                    except ConnectionError:
                        return "closed"
                    continue
                except ConnectionError:
                    return "closed"
                parts = line.split()
                return parts[1].decode() if len(parts) >= 2 else "closed"
            return "open"
        finally:
            writer.close()

    started = time.monotonic()
    for answer in await asyncio.gather(*(one() for _ in range(num_connections))):
        result.answers[answer] += 1
    result.seconds = time.monotonic() - started
    return result


async def churn_case(target: Target, num_connections: int, concurrency: int = 200) -> CaseResult:
    """Connections opened and dropped: a third at once, a third after half a request head, a third
    after a whole head and part of its body, reset (SO_LINGER 0) rather than closed."""
    result = CaseResult("connections opened and dropped", num_tried=num_connections)
    request = json.dumps(chat_body()).encode()
    full = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(request)}\r\n\r\n"
    ).encode() + request[: len(request) // 2]
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with gate:
            try:
                _reader, writer = await asyncio.open_connection(target.host, target.port)
            except OSError:
                return "refused"
            if i % 3 == 1:
                writer.write(full[:40])
            elif i % 3 == 2:
                writer.write(full)
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            return "dropped"

    started = time.monotonic()
    for answer in await asyncio.gather(*(one(i) for i in range(num_connections))):
        result.answers[answer] += 1
    result.seconds = time.monotonic() - started
    return result


async def slow_reader_case(target: Target, num_readers: int, hold_s: float, max_tokens: int) -> CaseResult:
    """Streams whose client never reads (a tiny receive window): the server must stop writing, drop
    them (its send-stall watchdog) and free their requests rather than buffer the stream."""
    result = CaseResult("slow readers (never drain)", num_tried=num_readers)
    body = json.dumps(
        {**chat_body("Count from one to a thousand.", stream=True, max_tokens=max_tokens), "ignore_eos": True}
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def one() -> str:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (target.host, target.port))
            await loop.sock_sendall(sock, request)
            await asyncio.sleep(hold_s)  # read nothing
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # what was buffered, then EOF if the server dropped it
                try:
                    data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 1.0)
                except TimeoutError:
                    break
                except ConnectionError:
                    return "closed"
                if not data:
                    return "closed"
            return "streaming"
        finally:
            sock.close()

    started = time.monotonic()
    for answer in await asyncio.gather(*(one() for _ in range(num_readers))):
        result.answers[answer] += 1
    result.seconds = time.monotonic() - started
    result.note = (
        "closed: dropped by the server once its socket stayed full; streaming: the connection was still "
        "open when the client hung up (the model had not filled the socket yet, or a short answer had "
        "ended and the connection idled in keep-alive): nothing to drop"
    )
    return result


async def still_serving(http: httpx.AsyncClient, target: Target) -> bool:
    try:
        health = await http.get(target.base_url + "/health")
        answer = await http.post(
            target.base_url + "/v1/chat/completions", json=chat_body("Say hi", max_tokens=4)
        )
    except httpx.HTTPError:
        return False
    return health.status_code == 200 and answer.status_code == 200


CaseRunner = Callable[[httpx.AsyncClient, Target], Awaitable[CaseResult]]
