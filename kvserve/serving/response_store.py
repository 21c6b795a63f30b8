"""Stored Responses-API responses: `previous_response_id` continuation and GET/DELETE by id.

Bounded LRU by count and by bytes. With a path, records live in SQLite (WAL) and survive
restarts; the in-memory index holds only ids and sizes, records are read on lookup.
Without a path (tests), records stay in memory.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvserve.chat.conversation import Message
from kvserve.serving.conversation_codec import decode_messages, encode_messages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the wire object, as GET returns it
    messages: tuple[Message, ...]  # the whole conversation including this response's output


class ResponseStore:
    def __init__(self, path: Path | None = None, max_responses: int = 10_000, max_bytes: int = 256 * 2**20):
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # LRU order, oldest first
        self._memory: dict[str, str] = {}  # used only without a database
        self._num_bytes = 0
        self._db = _open_db(path) if path is not None else None
        if self._db is not None:
            for response_id, size in self._db.execute("SELECT id, size FROM responses ORDER BY last_used"):
                self._sizes[response_id] = size
                self._num_bytes += size
            self._evict()

    def __len__(self) -> int:
        return len(self._sizes)

    def save(self, response_id: str, stored: StoredResponse) -> None:
        record = json.dumps(
            {"response": stored.response, "messages": encode_messages(stored.messages)}, ensure_ascii=False
        )
        size = len(record.encode())
        if size > self.max_bytes:
            logger.warning("response %s (%d bytes) exceeds the store's budget; not stored", response_id, size)
            return
        with self._lock:
            self._forget(response_id)
            self._sizes[response_id] = size
            self._num_bytes += size
            if self._db is None:
                self._memory[response_id] = record
            else:
                with self._db:
                    self._db.execute(
                        "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                        (response_id, time.time(), size, record),
                    )
            self._evict()

    def lookup(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            if response_id not in self._sizes and not self._adopt(response_id):
                return None
            self._sizes.move_to_end(response_id)
            if self._db is None:
                record = self._memory[response_id]
            else:
                with self._db:
                    row = self._db.execute(
                        "SELECT record FROM responses WHERE id = ?", (response_id,)
                    ).fetchone()
                    self._db.execute(
                        "UPDATE responses SET last_used = ? WHERE id = ?", (time.time(), response_id)
                    )
                if row is None:  # the file was edited under us: treat as absent
                    self._forget(response_id)
                    return None
                record = row[0]
        data = json.loads(record)
        return StoredResponse(data["response"], decode_messages(data["messages"]))

    def delete(self, response_id: str) -> bool:
        with self._lock:
            if response_id not in self._sizes and not self._adopt(response_id):
                return False
            self._forget(response_id)
            return True

    def _adopt(self, response_id: str) -> bool:
        """A record another process wrote into the same file (`serve --api-servers`: each front end
        has its own index of the one SQLite file) joins this index; False when there is none."""
        if self._db is None:
            return False
        row = self._db.execute("SELECT size FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return False
        self._sizes[response_id] = row[0]
        self._num_bytes += row[0]
        return True

    def _forget(self, response_id: str) -> None:
        size = self._sizes.pop(response_id, None)
        if size is None:
            return
        self._num_bytes -= size
        self._memory.pop(response_id, None)
        if self._db is not None:
            with self._db:
                self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))

    def _evict(self) -> None:
        while self._sizes and (len(self._sizes) > self.max_responses or self._num_bytes > self.max_bytes):
            self._forget(next(iter(self._sizes)))


def _open_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        path.touch(mode=0o600)  # conversations are private: owner-only from the first byte
    db = sqlite3.connect(path, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS responses ("
        "id TEXT PRIMARY KEY, last_used REAL NOT NULL, size INTEGER NOT NULL, record TEXT NOT NULL)"
    )
    os.chmod(path, 0o600)
    return db
