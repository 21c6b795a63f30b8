"""The router's policy: session and response affinity, the private prefix, least load, the threshold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.cluster.policy import AffinityPolicy, PolicySettings, ReplicaView
from kvserve.cluster.prefix_index import PrefixIndex
from kvserve.cluster.routing_keys import RoutingKeys

SYSTEM = tuple(range(1000, 1012))  # 12 blocks every session shares (a coding agent's system prompt)


def _replicas(*loads: int) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", f"tag{i}", n) for i, n in enumerate(loads)]


def _keys(session: str | None = None, blocks: tuple[int, ...] = (), tag: str | None = None) -> RoutingKeys:
    return RoutingKeys(session, "x_session_id" if session else None, tag, blocks)


def _turn(policy: AffinityPolicy, keys: RoutingKeys, replicas: list[ReplicaView], now: float = 0.0) -> str:
    decision = policy.choose(keys, replicas, now)
    policy.record(keys, decision.replica_id, now)
    return decision.replica_id


def test_a_session_sticks_to_its_replica_whatever_the_load() -> None:
    policy = AffinityPolicy()
    first = _turn(policy, _keys("s1", SYSTEM + (1,)), _replicas(0, 0))
    assert first == "r0"
    busy = [ReplicaView("r0", "tag0", 15), ReplicaView("r1", "tag1", 0)]
    decision = policy.choose(_keys("s1", SYSTEM + (1, 2)), busy, 1.0)
    assert (decision.replica_id, decision.reason) == ("r0", "session")


def test_new_sessions_over_a_common_system_prompt_spread() -> None:
    """The trap of prefix routers: every Claude Code session starts with the same long prompt."""
    policy = AffinityPolicy()
    replicas = _replicas(0, 0)
    homes = [_turn(policy, _keys(None, SYSTEM + (100 + i, 200 + i)), replicas, float(i)) for i in range(8)]
    assert homes.count("r0") == homes.count("r1") == 4


def test_a_turn_without_session_id_finds_the_replica_of_its_history() -> None:
    policy = AffinityPolicy()
    replicas = _replicas(0, 0)
    for i in range(4):
        _turn(policy, _keys(None, SYSTEM + (100 + i, 200 + i)), replicas)
    where = {i: policy.index.matched_length("r0", SYSTEM + (100 + i,)) > len(SYSTEM) for i in range(4)}
    for i in range(4):
        decision = policy.choose(_keys(None, SYSTEM + (100 + i, 200 + i, 300 + i)), replicas, 1.0)
        assert decision.reason == "prefix"
        assert decision.replica_id == ("r0" if where[i] else "r1")
        assert decision.matched_blocks == 2  # beyond the shared system prompt


def test_a_single_session_seen_so_far_is_all_private() -> None:
    policy = AffinityPolicy()
    _turn(policy, _keys(None, SYSTEM + (1,)), _replicas(0, 0))
    decision = policy.choose(_keys(None, SYSTEM + (1, 2)), _replicas(3, 0), 1.0)
    assert (decision.replica_id, decision.reason) == ("r0", "prefix")


def test_previous_response_id_outranks_the_session() -> None:
    policy = AffinityPolicy()
    _turn(policy, _keys("s1"), _replicas(0, 0))
    decision = policy.choose(_keys("s1", tag="tag1"), _replicas(0, 0), 1.0)
    assert (decision.replica_id, decision.reason) == ("r1", "response")
    gone = policy.choose(_keys("s1", tag="dead"), _replicas(0, 0), 1.0)
    assert (gone.replica_id, gone.reason) == ("r0", "session")


def test_a_replica_over_its_threshold_takes_no_new_session_but_keeps_its_own() -> None:
    policy = AffinityPolicy(PolicySettings(max_load=4))
    _turn(policy, _keys("old"), _replicas(0, 0))  # -> r0
    loaded = _replicas(4, 9)
    assert policy.choose(_keys("old"), loaded, 1.0).replica_id == "r0"
    # Both over: the least loaded still takes it (nowhere else to go).
    assert policy.choose(_keys("new"), loaded, 1.0) == ("r0", "least_loaded", 0)
    assert policy.choose(_keys("new"), _replicas(4, 3), 1.0).replica_id == "r1"
    # Nor by prefix: the history's replica is over its threshold.
    _turn(policy, _keys(None, (7, 8, 9)), _replicas(0, 0))
    assert policy.choose(_keys(None, (7, 8, 9, 10)), _replicas(4, 0), 1.0).replica_id == "r1"


def test_a_dead_replicas_sessions_move_and_stick_to_their_new_home() -> None:
    policy = AffinityPolicy()
    homes = {s: _turn(policy, _keys(s, (hash(s), 1, 2)), _replicas(0, 0, 0), 0.0) for s in "abcdef"}
    policy.forget_replica("r1")
    survivors = [r for r in _replicas(0, 0, 0) if r.replica_id != "r1"]
    for s, home in homes.items():
        moved = _turn(policy, _keys(s, (hash(s), 1, 2, 3)), survivors, 1.0)
        assert moved == home if home != "r1" else moved in ("r0", "r2")
        assert policy.choose(_keys(s), survivors, 2.0).replica_id == moved


def test_silent_sessions_stop_counting_towards_load() -> None:
    policy = AffinityPolicy(PolicySettings(session_ttl_s=10))
    _turn(policy, _keys("a"), _replicas(0, 0), 0.0)
    assert policy.num_sessions("r0", 5.0) == 1 and policy.num_sessions("r0", 11.0) == 0
    _turn(policy, _keys("b"), _replicas(1, 0), 8.0)
    assert policy.session_counts(9.0) == {"r0": 1, "r1": 1}
    assert policy.session_counts(12.0) == {"r1": 1}


def test_prefix_index_is_bounded() -> None:
    index = PrefixIndex(max_blocks_per_replica=10, max_branch_entries=10)
    index.insert("r0", tuple(range(100)))
    assert index.matched_length("r0", tuple(range(100))) == 0  # the oldest blocks went first
    assert index.matched_length("r0", tuple(range(90, 100))) == 10


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=40),
    st.integers(1, 4),
)
def test_sessions_never_split_and_stay_balanced(turns: list[tuple[int, int]], num_replicas: int) -> None:
    """Any interleaving of sessions' turns: each session lives on one replica, and new sessions go to a
    replica with the fewest live sessions (all requests here finish before the next arrives)."""
    policy = AffinityPolicy()
    replicas = _replicas(*([0] * num_replicas))
    home: dict[int, str] = {}
    for step, (session, length) in enumerate(turns):
        blocks = _chain((999, session, *range(length)))
        if session not in home:
            counts = [policy.num_sessions(r.replica_id, float(step)) for r in replicas]
            replica = _turn(policy, _keys(f"s{session}", blocks), replicas, float(step))
            assert policy.num_sessions(replica, float(step)) - 1 == min(counts)
            home[session] = replica
        assert _turn(policy, _keys(f"s{session}", blocks), replicas, float(step)) == home[session]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12))
def test_shared_length_never_exceeds_what_another_prompt_shares(prompts: list[list[int]]) -> None:
    index = PrefixIndex()
    chains = [_chain(tuple(p)) for p in prompts]
    for chain in chains[:-1]:
        index.insert("r0", chain)
    last = chains[-1]
    shared = index.shared_length(last)
    longest_common = max((_common(last, c) for c in chains[:-1]), default=0)
    assert shared <= longest_common


def _chain(values: tuple[int, ...]) -> tuple[int, ...]:
    """Chain hashes, as prefix_blocks makes them: equal only for equal prefixes."""
    return tuple(hash(values[: i + 1]) for i in range(len(values)))


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_policy_modules_import_neither_ray_nor_torch() -> None:
    """The router's core runs (and is tested) without Ray; only the adapters import it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "kvserve" / "cluster"
    for name in (
        "policy",
        "prefix_index",
        "prefix_blocks",
        "routing_keys",
        "replica_stats",
        "board",
        "in_flight",
    ):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ("ray", "torch")], (name, names)


def test_a_burst_of_new_sessions_spreads_before_any_is_confirmed() -> None:
    """Ray asks the router for all of a burst before it confirms any: the picks count as load."""
    from kvserve.cluster.in_flight import PROVISIONAL_TTL_S, InFlight

    policy, in_flight = AffinityPolicy(), InFlight()
    picks = []
    for i in range(4):
        counts = in_flight.counts(0.0)
        replicas = [ReplicaView(f"r{n}", f"t{n}", counts.get(f"r{n}", 0)) for n in range(2)]
        decision = policy.choose(_keys(f"s{i}"), replicas, 0.0)
        in_flight.chosen(f"req{i}", decision.replica_id, 0.0)
        picks.append(decision.replica_id)
    assert sorted(picks) == ["r0", "r0", "r1", "r1"]
    in_flight.routed("req0", "r1", 1.0)  # Ray sent it elsewhere (r0 was full)
    in_flight.finished("req1")
    assert in_flight.counts(1.0) == {"r1": 2, "r0": 1}
    assert in_flight.counts(PROVISIONAL_TTL_S + 10) == {"r1": 1}  # unconfirmed picks expire
    in_flight.forget_replica("r1")
    assert in_flight.counts(PROVISIONAL_TTL_S + 10) == {}


def test_each_replica_keeps_its_own_local_disk_tier(tmp_path) -> None:
    """A local tier's directory is one server's (exclusive lock, repair, eviction): replicas of one
    node get a folder each under --kv-cache-dir, by Ray's local rank (a replacement reuses it)."""
    from types import SimpleNamespace

    from kvserve.cluster.replica import _local_slot, replica_kv_dir

    base = str(tmp_path)
    first = replica_kv_dir(base, _local_slot(SimpleNamespace(rank=SimpleNamespace(local_rank=0)), "a"))
    second = replica_kv_dir(base, _local_slot(SimpleNamespace(rank=SimpleNamespace(local_rank=1)), "b"))
    assert first != second and first.startswith(base) and second.startswith(base)
    assert replica_kv_dir(base, _local_slot(SimpleNamespace(rank=None), "tag9")).endswith("replica-tag9")
