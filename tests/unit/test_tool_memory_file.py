"""The tool replay memory's file: restart round trip, saves only on change, bad files and disk
errors never raise."""

from __future__ import annotations

import errno
import json
import stat
from pathlib import Path

import pytest

from kvserve.serving import tool_memory_file
from kvserve.serving.tool_memory import ToolReplayMemory
from kvserve.serving.tool_memory_file import FILE_NAME, ToolMemoryFile

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3, "city": "Paris"}}\n</tool_call>'


def test_a_restarted_memory_replays_the_sampled_bytes(tmp_path: Path) -> None:
    memory = ToolReplayMemory()
    saver = ToolMemoryFile(tmp_path, memory)
    memory.remember([(CALL, ("call_1",))])
    saver.close()  # the shutdown save
    assert stat.S_IMODE((tmp_path / FILE_NAME).stat().st_mode) == 0o600

    restored = ToolReplayMemory()
    assert ToolMemoryFile(tmp_path, restored).load() == 1
    assert restored.replay(["call_1"]) == CALL


def test_writes_only_when_the_memory_changed(tmp_path: Path) -> None:
    memory = ToolReplayMemory()
    saver = ToolMemoryFile(tmp_path, memory)
    assert not saver.save_if_changed()
    assert not (tmp_path / FILE_NAME).exists()
    memory.remember([(CALL, ("call_1",))])
    assert saver.save_if_changed()
    assert not saver.save_if_changed()


def test_background_saver_writes_soon_after_a_change(tmp_path: Path) -> None:
    memory = ToolReplayMemory()
    saver = ToolMemoryFile(tmp_path, memory, interval_s=0.01)
    saver.start()
    memory.remember([(CALL, ("call_1",))])
    try:
        for _ in range(500):
            if (tmp_path / FILE_NAME).exists():
                break
            saver._stop.wait(0.01)
        assert json.loads((tmp_path / FILE_NAME).read_text())["lru"]
    finally:
        saver.close()


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 999, "blocks": [], "lru": []}', b"[]"])
def test_a_corrupt_or_foreign_file_is_ignored(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    memory = ToolReplayMemory()
    assert ToolMemoryFile(tmp_path, memory).load() == 0


def test_a_disk_error_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tool_memory_file, "write_atomic", full)
    memory = ToolReplayMemory()
    saver = ToolMemoryFile(tmp_path, memory)
    memory.remember([(CALL, ("call_1",))])
    assert not saver.save_if_changed()
    assert "cannot save" in caplog.text
