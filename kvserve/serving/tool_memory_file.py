"""The tool replay memory's file beside the disk KV checkpoints, so exact replay survives a restart.

A checkpoint restored after a restart holds the tokens of calls the model sampled; the next turn
replays those calls from the client's history (arguments re-serialized), and only the memory knows
the sampled bytes that make the rendered prompt match the checkpoint. The memory is bounded (ids and
bytes) and usually small, so it is saved whole, off the request path: a background thread writes it
when it changed (at most every `interval_s`), and `close()` writes it once more at shutdown.
Writes are atomic (temp + fsync + rename) and 0600, like the checkpoints.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from kvserve.kvstore.atomic_file import ensure_private_dir, write_atomic
from kvserve.serving.tool_memory import ToolReplayMemory

logger = logging.getLogger(__name__)

FILE_NAME = "tool_memory.json"


class ToolMemoryFile:
    """Disk errors are logged, never raised: without the memory a replay renders canonically, which
    is still correct (it only costs the cache hit past the call)."""

    def __init__(self, directory: Path, memory: ToolReplayMemory, interval_s: float = 2.0) -> None:
        self.path = directory / FILE_NAME
        self.memory = memory
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._saved_changes = memory.num_changes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self) -> int:
        """Merges the saved calls into the memory; returns how many call ids it holds."""
        try:
            self.memory.merge_json(json.loads(self.path.read_bytes()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as error:  # corrupt, or another version: start without it
            logger.warning("tool replay memory: ignoring %s: %s", self.path, error)
        else:
            logger.info("tool replay memory: %d call ids restored from %s", len(self.memory), self.path)
        self._saved_changes = self.memory.num_changes
        return len(self.memory)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvserve-tool-memory", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the saver and writes the last changes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.save_if_changed()

    def save_if_changed(self) -> bool:
        with self._lock:
            changes = self.memory.num_changes
            if changes == self._saved_changes:
                return False
            payload = json.dumps(self.memory.to_json(), ensure_ascii=False).encode()
            try:
                ensure_private_dir(self.path.parent)
                write_atomic(self.path, [payload])
            except OSError as error:
                logger.warning("tool replay memory: cannot save %s: %s", self.path, error)
                return False
            self._saved_changes = changes
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.save_if_changed()
