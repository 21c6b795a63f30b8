"""The console's Cluster tab in headless Chromium: the single server's app (FakeEngine) behind the
cluster ingress's own routes (`board_routes`: /kvserve/v1/cluster and /metrics answered from a
router board, everything else passed on), as `kvserve cluster` serves the page. The tab shows each
replica's load, hit rate and routing decisions and follows the board without a reload; a single
server's console has no such tab. Skips without Chromium or Playwright."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvserve.api.app import create_app
from kvserve.api.settings import ApiSettings
from kvserve.cluster.board import RoutingBoard
from kvserve.cluster.board_routes import board_response
from kvserve.cluster.replica_stats import ReplicaStats
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from tests.api.fake_engine import FakeEngine, FakeTokenizerInfo, reply
from tests.browser import browser_page, require_browser
from tests.live_uvicorn import serve_in_thread

sync_api = require_browser()

KEY = "cluster-console-key"


def _replica_app(api_key: str | None) -> Any:
    engine = FakeEngine(lambda _ids: reply("hi"))
    settings = ChatServiceSettings(model_name="fake-model", max_model_len=4096)
    service = ChatService(engine, FakeTokenizerInfo(), settings)
    return create_app(service, ApiSettings(served_model_name="fake-model", api_key=api_key))


def _behind_ingress(app: Any, source: RoutingBoard, api_key: str) -> Any:
    """What the ingress does: its board routes first, the rest to the replica's app."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            own = board_response(scope["method"], scope["path"], scope["headers"], api_key, source)
            if own is not None:
                await own(scope, receive, send)
                return
        await app(scope, receive, send)

    return asgi


def _stats(tag: str, node: str, prompt: int, cached: int, running: int = 0) -> ReplicaStats:
    return ReplicaStats(
        tag, pid=100, node_id=node, num_running=running, kv_usage=0.5, num_prompt_tokens=prompt,
        num_cached_prompt_tokens=cached, num_generation_tokens=7,
    )  # fmt: skip


@pytest.fixture(scope="module")
def board() -> RoutingBoard:
    source = RoutingBoard()
    stats = {
        "rep-a": _stats("rep-a", "node-1", 1000, 900, running=2),
        "rep-b": _stats("rep-b", "node-2", 1000, 500),
    }
    source.set_replicas(stats, {"rep-a": 2}, time.time(), sessions={"rep-a": 3, "rep-b": 1})
    for reason, tag in [("session", "rep-a"), ("session", "rep-a"), ("least_loaded", "rep-b")]:
        source.count_decision(reason, tag)
    return source


@pytest.fixture(scope="module")
def cluster_url(board: RoutingBoard) -> Iterator[str]:
    with serve_in_thread(_behind_ingress(_replica_app(KEY), board, KEY)) as (url, _):
        yield url


@pytest.fixture(scope="module")
def single_url() -> Iterator[str]:
    with serve_in_thread(_replica_app(None)) as (url, _):
        yield url


def test_the_cluster_tab_shows_replicas_and_follows_the_board(cluster_url: str, board: RoutingBoard) -> None:
    assert httpx.get(f"{cluster_url}/kvserve/v1/cluster").status_code == 401  # behind the key
    with browser_page(sync_api) as page:
        page.goto(f"{cluster_url}/#cluster")
        page.locator("#key-dialog").wait_for(state="visible")  # the page's first API call got a 401
        page.fill("#key-input", KEY)
        page.click("#key-save")
        sync_api.expect(page.locator("#tab-cluster")).to_be_visible()
        sync_api.expect(page.locator("#page-cluster")).to_be_visible()
        rows = page.locator("#replicas tbody tr")
        sync_api.expect(rows).to_have_count(2)
        first = page.locator('#replicas tr[data-replica="rep-a"]')
        sync_api.expect(first.locator(".hit-rate")).to_have_text("90.0%")
        sync_api.expect(first.locator(".decisions")).to_have_text("session 2")
        assert first.locator("td").nth(2).text_content() == "2"  # in flight
        assert first.locator("td").nth(3).text_content() == "3"  # sessions
        sync_api.expect(page.locator("#cluster-hit-rate")).to_contain_text("70.0%")
        sync_api.expect(page.locator('#cluster-decisions [data-reason="least_loaded"]')).to_contain_text("1")
        # The board moves (a replica replaced, requests routed): the tab follows without a reload.
        board.set_replicas({"rep-a": _stats("rep-a", "node-1", 2000, 1900)}, {}, time.time())
        board.count_decision("prefix", "rep-a")
        sync_api.expect(rows).to_have_count(1, timeout=10_000)
        sync_api.expect(first.locator(".hit-rate")).to_have_text("95.0%")
        sync_api.expect(first.locator(".decisions")).to_have_text("session 2 · prefix 1")
        page.click("#tab-cache")  # the other tabs are the replica's own, as before
        sync_api.expect(page.locator("#page-cache")).to_be_visible()
        sync_api.expect(page.locator("#page-cluster")).to_be_hidden()


def test_a_single_server_has_no_cluster_tab(single_url: str) -> None:
    assert httpx.get(f"{single_url}/kvserve/v1/cluster").status_code == 404
    with browser_page(sync_api) as page:
        page.goto(f"{single_url}/#cluster")
        sync_api.expect(page.locator("#model-name")).to_contain_text("fake-model")
        sync_api.expect(page.locator("#page-chat")).to_be_visible()  # an unknown tab: the chat
        page.wait_for_timeout(500)  # the cluster probe has answered by now
        sync_api.expect(page.locator("#tab-cluster")).to_be_hidden()
