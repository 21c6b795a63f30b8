"""KVCacheManager: block tables, prefix hits (repeat, extension, branch, running owner), eviction, stats."""

from __future__ import annotations

import random

from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams

BLOCK_SIZE = 16


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(request_id, list(token_ids), SamplingParams(max_tokens=16))


def random_tokens(num_tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32000) for _ in range(num_tokens)]


def prefill(kv: KVCacheManager, request: Request) -> None:
    """Admit a request with its prefix hit and compute all of its tokens, as the scheduler would."""
    hit = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - hit.num_computed_tokens, hit.blocks) is not None
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)


def test_miss_then_allocate_and_free_returns_every_block() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=65)
    request = make_request("a", random_tokens(100, 0))
    hit = kv.get_computed_blocks(request)
    assert hit.blocks == [] and hit.num_computed_tokens == 0
    new_blocks = kv.allocate_slots(request, 100)
    assert new_blocks is not None and len(new_blocks) == 7
    assert kv.block_ids("a") == [b.block_id for b in new_blocks] and 0 not in kv.block_ids("a")
    assert kv.num_free_blocks == 64 - 7 and kv.usage == 7 / 64
    kv.free(request)
    assert kv.num_free_blocks == 64 and kv.block_ids("a") == []


def test_exact_repeat_hits_all_full_blocks_but_leaves_a_token_to_compute() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=129)
    tokens = random_tokens(1000, 1)
    first = make_request("a", tokens)
    prefill(kv, first)
    kv.free(first)
    hit = kv.get_computed_blocks(make_request("b", tokens))
    assert hit.num_computed_tokens == 992  # (1000 - 1) // 16 full blocks
    aligned = make_request("c", tokens[:992])
    assert kv.get_computed_blocks(aligned).num_computed_tokens == 976  # one block short: 991 // 16


def test_branch_from_the_middle_reuses_the_shared_full_block_prefix() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=129)
    tokens = random_tokens(1000, 2)
    prefill(kv, make_request("a", tokens))
    branch = make_request("b", tokens[:600] + random_tokens(300, 3))
    hit = kv.get_computed_blocks(branch)
    assert hit.num_computed_tokens == 592  # 600 // 16 full blocks
    assert [b.block_id for b in hit.blocks] == kv.block_ids("a")[:37]
    shorter = make_request("c", tokens[:250])
    assert kv.get_computed_blocks(shorter).num_computed_tokens == 240


def test_extension_of_a_finished_conversation_hits_prompt_and_output() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=65)
    first = make_request("a", random_tokens(100, 4))
    prefill(kv, first)
    for token in range(500, 530):  # decode: the KV of a sampled token is computed a step later
        first.output_token_ids.append(token)
        if token < 529:  # the last sampled token of a finished request is never computed
            assert kv.allocate_slots(first, 1) is not None
            first.num_computed_tokens += 1
            kv.cache_blocks(first, first.num_computed_tokens)
    kv.free(first)
    follow_up = make_request("b", first.all_token_ids + random_tokens(40, 5))
    assert kv.get_computed_blocks(follow_up).num_computed_tokens == 128  # 129 computed tokens


def test_reuse_from_a_running_request_shares_blocks_with_ref_counts() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=33)
    tokens = random_tokens(64, 6)
    owner = make_request("a", tokens)
    prefill(kv, owner)
    free_before = kv.num_free_blocks
    sharer = make_request("b", tokens + [1, 2, 3])
    hit = kv.get_computed_blocks(sharer)
    assert hit.num_computed_tokens == 64
    assert kv.allocate_slots(sharer, 3, hit.blocks) is not None
    assert kv.num_free_blocks == free_before - 1  # only the partial tail block is new
    assert all(block.ref_cnt == 2 for block in hit.blocks)
    kv.free(owner)
    assert all(block.ref_cnt == 1 for block in hit.blocks) and kv.num_free_blocks == free_before - 1
    kv.free(sharer)
    assert kv.num_free_blocks == 32


def test_allocation_counts_revived_cached_blocks_against_the_free_list() -> None:
    kv = KVCacheManager(4, num_blocks=5)  # 4 usable blocks
    tokens = list(range(12))
    prefill(kv, make_request("a", tokens))  # 3 blocks, all cached
    kv.free(make_request("a", tokens))
    request = make_request("b", tokens + list(range(100, 108)))  # 20 tokens: 5 blocks
    hit = kv.get_computed_blocks(request)
    assert hit.num_computed_tokens == 12 and kv.num_free_blocks == 4
    # 2 new blocks <= 4 free, but the 3 hit blocks are free too: 5 > 4 must fail, changing nothing.
    assert kv.allocate_slots(request, 8, hit.blocks) is None
    assert kv.num_free_blocks == 4 and kv.block_ids("b") == []
    assert all(block.ref_cnt == 0 for block in hit.blocks)


def test_freed_cached_blocks_are_evicted_lru_under_pressure() -> None:
    kv = KVCacheManager(4, num_blocks=9)  # 8 usable
    old, recent = make_request("old", list(range(16))), make_request("recent", list(range(50, 66)))
    prefill(kv, old)
    prefill(kv, recent)
    kv.free(old)
    kv.free(recent)
    filler = make_request("filler", list(range(900, 916)))  # needs 4 blocks: evicts the older prefix
    prefill(kv, filler)
    assert kv.get_computed_blocks(make_request("x", list(range(17)))).num_computed_tokens == 0
    assert kv.get_computed_blocks(make_request("y", list(range(50, 67)))).num_computed_tokens == 16


def test_growing_a_request_allocates_only_when_a_block_fills() -> None:
    kv = KVCacheManager(4, num_blocks=9)
    request = make_request("a", [1, 2, 3])
    assert len(kv.allocate_slots(request, 3) or []) == 1
    request.num_computed_tokens = 3
    request.output_token_ids.append(4)
    assert kv.allocate_slots(request, 1) == []  # token 4 still fits in block 0
    request.num_computed_tokens = 4
    request.output_token_ids.append(5)
    assert len(kv.allocate_slots(request, 1) or []) == 1
    assert len(kv.block_ids("a")) == 2


def test_prefix_cache_stats_count_each_admission_once() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=65)
    tokens = random_tokens(100, 7)
    prefill(kv, make_request("a", tokens))
    repeat = make_request("b", tokens)
    kv.get_computed_blocks(repeat)  # a lookup that is retried later is not counted twice
    prefill(kv, repeat)
    assert kv.stats.num_requests == 2
    assert kv.stats.num_query_tokens == 200 and kv.stats.num_hit_tokens == 96
    assert kv.stats.hit_rate == 96 / 200


def test_extra_key_and_reset_separate_caches() -> None:
    tokens = random_tokens(64, 8)
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=17, extra_key=b"model-a")
    prefill(kv, make_request("a", tokens))
    other_model = KVCacheManager(BLOCK_SIZE, num_blocks=17, extra_key=b"model-b")
    hashes_a = kv._block_hashes(make_request("x", tokens), 64)
    hashes_b = other_model._block_hashes(make_request("x", tokens), 64)
    assert not set(hashes_a) & set(hashes_b)
    kv.reset_prefix_cache()
    assert kv.get_computed_blocks(make_request("b", tokens)).num_computed_tokens == 0


def test_free_of_unknown_request_is_a_no_op() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=5)
    kv.free(make_request("ghost", [1, 2, 3]))
    assert kv.num_free_blocks == 4


def test_a_reused_request_id_does_not_inherit_stale_hashes() -> None:
    kv = KVCacheManager(4, num_blocks=9)
    prefill(kv, make_request("same-id", list(range(8))))
    kv.free(make_request("same-id", list(range(8))))
    other = make_request("same-id", list(range(100, 109)))
    assert kv.get_computed_blocks(other).num_computed_tokens == 0


def test_a_listener_hears_what_a_freed_request_leaves_cached() -> None:
    kv = KVCacheManager(BLOCK_SIZE, num_blocks=65)
    freed: list[tuple[str, int, int]] = []
    kv.listen(
        on_free=lambda request, seq: freed.append(
            (request.request_id, len(seq.token_ids), len(seq.block_hashes))
        )
    )
    done = make_request("done", random_tokens(100, 9))
    prefill(kv, done)
    kv.free(done)
    waiting = make_request("waiting", random_tokens(100, 10))
    kv.get_computed_blocks(waiting)  # hashed at an admission lookup, never admitted
    kv.free(waiting)
    assert freed == [("done", 96, 6)]  # its 6 full blocks; nothing for one that held no blocks
    assert kv.block_ids("done") == [] and kv.block_ids("waiting") == []
