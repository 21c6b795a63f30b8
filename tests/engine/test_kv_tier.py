"""The KVTier seam of EngineCore (tiny random llama, CPU): the calls a tier gets and when, and that
a tier keeping KV somewhere other than a directory (here a dict shared by two engines, as replicas
would share a network tier) serves a prefix with the cold run's tokens."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch

from kvserve.engine.core import EngineCore
from kvserve.engine.kv_cache.block_hash import BlockHash
from kvserve.engine.kv_cache.block_pool import Block
from kvserve.engine.kv_cache.manager import CachedSequence, KVCacheManager
from kvserve.engine.kv_tier import BlockCopier, NullKVTier
from kvserve.engine.outputs import EngineOutput, SchedulerOutput
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


class DictTier:
    """Keeps each released sequence's blocks' KV in a dict by chain hash; logs the engine's calls."""

    can_load = True

    def __init__(self) -> None:
        self.kv_of: dict[BlockHash, list[torch.Tensor]] = {}  # per layer [2, BLOCK, kv_heads, head_dim]
        self.calls: list[tuple[str, object]] = []
        self._hits: dict[str, tuple[list[Block], list[BlockHash]]] = {}

    def bind(self, kv: KVCacheManager, blocks: BlockCopier) -> None:
        self.calls.append(("bind", kv))
        self.kv, self.blocks = kv, blocks
        kv.listen(on_free=self._on_free)

    def _on_free(self, request: Request, sequence: CachedSequence) -> None:
        block_ids = []
        for block_hash in sequence.block_hashes:
            block = self.kv.lookup(block_hash)
            assert block is not None  # freed blocks stay cached until evicted
            block_ids.append(block.block_id)
        kv = self.blocks.copy_blocks_out(block_ids)
        for i, block_hash in enumerate(sequence.block_hashes):
            self.kv_of[block_hash] = [layer[:, i * BLOCK : (i + 1) * BLOCK] for layer in kv]

    def lookup(self, request: Request) -> int:
        self.calls.append(("lookup", request.request_id))
        ram = self.kv.get_computed_blocks(request).blocks
        hashes = self.kv.block_hashes(request)[: (request.num_tokens - 1) // BLOCK]
        end = len(ram)
        while end < len(hashes) and hashes[end] in self.kv_of:
            end += 1
        self._hits[request.request_id] = (ram, hashes[len(ram) : end])
        return (end - len(ram)) * BLOCK

    def load(self, request: Request) -> int:
        self.calls.append(("load", request.request_id))
        ram, hashes = self._hits.pop(request.request_id)
        blocks = self.kv.load_cached_blocks(hashes, ram)
        if blocks is None:
            return 0
        per_block = [self.kv_of[h] for h in hashes]
        kv = [torch.cat([b[layer] for b in per_block], dim=1) for layer in range(len(per_block[0]))]
        self.blocks.copy_blocks_in([b.block_id for b in blocks], kv)
        return len(hashes) * BLOCK

    def save_evicted(self) -> None:
        pass

    def save(self, scheduler_output: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
        self.calls.append(("save", [o.request_id for o in outputs]))
        return outputs

    def request_finished(self, request_ids: Sequence[str]) -> None:
        self.calls.append(("request_finished", list(request_ids)))

    def shutdown(self, running: Sequence[Request]) -> None:
        self.calls.append(("shutdown", [r.request_id for r in running]))


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _run(engine: EngineCore, prompt: list[int], request_id: str) -> tuple[list[int], Request]:
    request = engine.make_request(request_id, prompt, GREEDY)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request


def test_without_a_kv_store_the_tier_is_the_null_one(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir)
    assert isinstance(engine.kv_tier, NullKVTier) and engine.disk_tier is None


def test_a_tier_shared_by_two_engines_serves_the_prefix_with_the_cold_tokens(tiny_llama_dir: Path) -> None:
    tier = DictTier()
    first = make_engine(tiny_llama_dir, open_tier=lambda config, loaded, cache_key: tier)
    assert tier.calls == [("bind", first.kv_manager)]
    base = _prompt(200, 1)
    _run(first, base, "a")
    assert [c for c in tier.calls if c[0] in ("lookup", "load")] == [("lookup", "a")]  # nothing held yet
    assert ("request_finished", ["a"]) in tier.calls and len(tier.kv_of) == (200 + 8 - 1) // BLOCK

    tier.calls.clear()
    second = make_engine(tiny_llama_dir, open_tier=lambda config, loaded, cache_key: tier)  # RAM empty
    follow_up = base + _prompt(30, 2)
    tokens, request = _run(second, follow_up, "b")
    assert request.num_cached_tokens == 200 // BLOCK * BLOCK  # the prompt's blocks; its output differs
    assert [c[0] for c in tier.calls[:3]] == ["bind", "lookup", "load"]
    assert tier.calls[-1] == ("request_finished", ["b"])
    assert all(c[1] == ["b"] for c in tier.calls if c[0] == "save")  # one output a step, this request's
    cold, cold_request = _run(make_engine(tiny_llama_dir), follow_up, "c")
    assert cold_request.num_cached_tokens == 0 and tokens == cold
    second.shutdown()
    assert tier.calls[-1] == ("shutdown", [])
