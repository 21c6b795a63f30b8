"""Pure pieces of the disk tier's wiring: the --kv-cache-* flags, turn markers of chat
templates, the block pool's eviction hook and KVCacheManager's blocks loaded from disk."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvserve.chat.render import CHATML_TEMPLATE, ChatRenderer
from kvserve.cli.engine_args import add_engine_args, add_kv_store_args, engine_config_from_args
from kvserve.config import KVStoreConfig
from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams
from kvserve.kvstore.cache_dir import default_cache_dir
from kvserve.serving.turn_markers import turn_marker_texts

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
NO_GENERATION_PROMPT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _config(*flags: str, kv_flags: bool = True):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    if kv_flags:
        add_kv_store_args(parser)
    return engine_config_from_args(parser.parse_args(list(flags)))


def test_kv_cache_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "kvserve" / "kv"
    assert _config().kv_store == KVStoreConfig(directory=str(tmp_path / "kvserve" / "kv"), budget_mb=4096)
    custom = _config("--kv-cache-dir", "/x/kv", "--kv-cache-budget-mb", "10").kv_store
    assert custom is not None and (custom.directory, custom.budget_mb) == ("/x/kv", 10)
    assert _config("--no-kv-cache").kv_store is None
    assert _config(kv_flags=False).kv_store is None  # generate/chat/bench: no disk tier
    with pytest.raises(SystemExit):
        _config("--kv-cache-budget-mb", "0")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (CHATML_TEMPLATE, ("<|im_start|>user", "<|im_start|>assistant")),
        (
            LLAMA3,
            ("<|start_header_id|>user<|end_header_id|>", "<|start_header_id|>assistant<|end_header_id|>"),
        ),
        (NO_GENERATION_PROMPT, None),
    ],
)
def test_turn_markers_of_chat_templates(template: str, expected: tuple[str, str] | None) -> None:
    assert turn_marker_texts(ChatRenderer(template, {"bos_token": "<s>"})) == expected


def _request(tokens: list[int]) -> Request:
    return Request("r", tokens, SamplingParams(max_tokens=1))


def test_blocks_loaded_from_disk_are_found_as_prefix_hits_and_evictions_are_reported() -> None:
    manager = KVCacheManager(block_size=4, num_blocks=9, extra_key="m")  # 8 usable blocks
    evicted: list[int] = []
    manager.listen(on_evict=lambda block, block_hash: evicted.append(block_hash))
    tokens = list(range(20))
    hashes = compute_block_hashes(tokens, 4, "m")
    # The first block is cached in RAM already; blocks 1-3 come from disk.
    first = _request(tokens[:4] + [99])
    manager.allocate_slots(first, 5)
    manager.cache_blocks(first, 4)
    manager.free(first)
    ram = manager.get_computed_blocks(_request(tokens)).blocks
    assert len(ram) == 1
    loaded = manager.load_cached_blocks(hashes[1:4], keep=ram)
    assert loaded is not None and all(b.ref_cnt == 0 for b in loaded)
    hit = manager.get_computed_blocks(_request(tokens))
    assert hit.num_computed_tokens == 16 and hit.blocks[1:] == loaded
    assert evicted == []
    # Filling the pool evicts the cached blocks (a prefix's last blocks first) and says so.
    other = _request(list(range(100, 132)))
    manager.allocate_slots(other, 32)
    assert evicted == [hashes[3], hashes[2], hashes[1], hashes[0]]
    assert manager.load_cached_blocks(hashes[:1]) is None  # no free block left


def test_metrics_expose_the_disk_tier() -> None:
    from prometheus_client import generate_latest

    from kvserve.api.metrics import Metrics
    from kvserve.serving.engine_stats import DiskCacheStats, EngineStats

    disk = DiskCacheStats(2, 5952, 3, 4096, 5, 8192, 1, 4, 2560)
    text = generate_latest(Metrics(lambda: EngineStats(1, 0, 0.5, 0.1, disk=disk)).registry).decode()
    for line in (
        "kvserve_kv_disk_hits 2.0",
        "kvserve_kv_disk_hit_tokens 5952.0",
        "kvserve_kv_disk_entries 5.0",
        "kvserve_kv_shared_hits 4.0",
        "kvserve_kv_shared_hit_tokens 2560.0",
    ):
        assert line in text
    assert "kvserve_kv_disk_bytes 8192.0" in text and "kvserve_kv_disk_evictions 1.0" in text
    off = generate_latest(Metrics(lambda: EngineStats(1, 0, 0.5, 0.1)).registry).decode()
    assert "kvserve_kv_disk_hits 0.0" in off


def test_anthropic_usage_splits_the_prompt_into_read_written_and_neither() -> None:
    from kvserve.api.anthropic_messages.adapter import usage_json
    from kvserve.serving.events import Usage

    usage = usage_json(
        Usage(prompt_tokens=1000, completion_tokens=5, cached_tokens=0, cache_write_tokens=512)
    )
    assert usage["input_tokens"] == 488 and usage["cache_creation_input_tokens"] == 512
    assert usage_json(Usage(1000, 5, 992))["cache_read_input_tokens"] == 992


def test_kv_cache_dtype_flag() -> None:
    """One dtype for the KV in the pool and on disk (config.resolve fills auto: tests/unit/test_kv_dtype.py)."""
    assert _config("--kv-cache-dtype", "float32").cache.kv_dtype == "float32"
    assert _config().cache.kv_dtype == "auto"
