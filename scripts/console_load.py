"""Is the web console responsive with 1,000 disk checkpoints and 100 requests/s of traffic?

Fills a real CheckpointStore (a tiny KV layout, synthetic KV) with N checkpoints, serves the real
app over a FakeEngine (the serving pipeline, the recorder and the console API are all real; only
the model is scripted), drives R chat requests/s through HTTP, and meanwhile times (1) the console's
API calls from a client and (2) the page in headless Chromium: first render, each poll's fetch +
render, long tasks, and a sort click. Writes a JSON summary and optionally a screenshot.

    PYTHONPATH=. python scripts/console_load.py --json docs/console-load.json \\
        --screenshot docs/console-cache-load.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import replace
from pathlib import Path

import httpx
import torch

from kvserve.api.app import create_app
from kvserve.chat.conversation import ChatRequest, GenerationOptions, Message, TextPart
from kvserve.cli.console_sources import DiskViewCache
from kvserve.cli.embedded import serve_in_thread
from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import SAVE_REASONS, CheckpointMeta, StoreIdentity
from kvserve.kvstore.checkpoint_store import CheckpointStore
from kvserve.serving.cache_view import BlockPoolView, CacheView
from kvserve.serving.chat_service import ChatService
from kvserve.serving.chat_settings import ChatServiceSettings
from kvserve.serving.engine_protocol import EngineFinishReason as FinishReason
from kvserve.serving.engine_protocol import EngineOutput
from kvserve.serving.generation_run import GenerationRun
from kvserve.serving.prefill_progress import PrefillTracker
from kvserve.serving.prompt_divergence import common_prefix_len
from kvserve.serving.request_recorder import RequestRecorder
from tests.api.fake_engine import EOS_ID, FakeTokenizerInfo, reply

IDENTITY = StoreIdentity(
    "console-load:float32", "float32", num_layers=2, num_kv_heads=1, head_dim=8, block_size=16
)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
SYSTEM = "You are a coding agent. Tools: read, write, edit, bash, search. Be precise and brief. " * 12


def fill_store(directory: Path, num_checkpoints: int) -> CheckpointStore:
    """Checkpoints of 64-512 tokens in families sharing a prefix (as agent sessions do), with
    varied reasons, ages and hits."""
    store = CheckpointStore(directory, IDENTITY, 4 << 30, chunk_tokens=64)
    rng = random.Random(0)
    now = time.time()
    prefixes = [[rng.randrange(50000) for _ in range(64)] for _ in range(num_checkpoints // 10 + 1)]
    for i in range(num_checkpoints):
        tokens = prefixes[i // 10] + [rng.randrange(50000) for _ in range(64 * rng.randrange(0, 7))]
        created = now - rng.uniform(0, 3 * 86400)
        meta = CheckpointMeta.new(IDENTITY, f"checkpoint {i}: " + " ".join(map(str, tokens)), len(tokens),
                                  rng.choice(SAVE_REASONS), now=created)  # fmt: skip
        meta = replace(meta, hits=rng.choice([0, 0, 1, 2, 5, 20]), last_used=created + rng.uniform(0, 3600))
        hashes = compute_block_hashes(tokens, IDENTITY.block_size, IDENTITY.fingerprint)
        kv = [torch.randn(2, len(tokens), 1, 8) for _ in range(IDENTITY.num_layers)]
        store.save(
            meta, tokens, hashes, lambda span, kv=kv: [layer[:, span.start : span.end] for layer in kv]
        )
    return store


class ScriptedEngine:
    """The model stand-in: a fixed reply, one prefill-progress report, and a prefix-cache hit of the
    whole blocks this prompt shares with the previous one (cheap: the load is on the console, not
    on a simulated cache)."""

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply_ids = reply_ids
        self.previous = array("i")

    async def generate(self, request_id, prompt_token_ids, params, constraint=None, checkpoint_hint=None):
        prompt = array("i", prompt_token_ids)
        n = len(prompt)
        cached = min(common_prefix_len(prompt, self.previous), n - 1) // 16 * 16
        self.previous = prompt
        yield EngineOutput(request_id, (), num_prompt_tokens=n, num_cached_tokens=cached,
                           num_computed_tokens=(n + cached) // 2)  # fmt: skip
        await asyncio.sleep(0.005)
        tokens = self.reply_ids[: params.max_tokens]
        for i, token_id in enumerate(tokens):
            last = i + 1 == len(tokens)
            reason = (FinishReason.STOP if token_id in (EOS_ID,) else FinishReason.LENGTH) if last else None
            yield EngineOutput(request_id, (token_id,), finish_reason=reason, num_prompt_tokens=n,
                               num_cached_tokens=cached)  # fmt: skip


def time_recorder(num_requests: int = 2000) -> dict[str, float]:
    """What recording costs a request on the event loop (start + end; nothing runs per token), by
    prompt length: end() keeps the prompt as an int32 array, a copy of its tokens."""
    recorder = RequestRecorder()
    result = {}
    for num_tokens in (1_000, 32_000):
        prompt = list(range(num_tokens))
        count = num_requests if num_tokens < 10_000 else num_requests // 10
        runs = []
        for i in range(count):
            prefill = PrefillTracker(f"r{i}", num_tokens)
            prefill.finish(num_tokens // 2)
            run = GenerationRun(None, prefill)  # type: ignore[arg-type]
            run.num_output_tokens, run._reason = 16, "stop"
            runs.append(run)
        started = time.perf_counter()
        for i, run in enumerate(runs):
            recorder.start(f"{num_tokens}-{i}", prompt, run)
            recorder.end(f"{num_tokens}-{i}")
        result[f"{num_tokens}_token_prompt_us"] = round((time.perf_counter() - started) / count * 1e6, 1)
    return result


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"n": len(values), "p50": round(statistics.median(ordered), 2), "p95": round(pick(0.95), 2),
            "max": round(ordered[-1], 2)}  # fmt: skip


class Traffic:
    """`rate` chat requests/s through the serving pipeline (ChatService: render, tokens, engine,
    output events, the recorder), on an event loop of their own, until stopped. Not through HTTP:
    on this 2-core machine the HTTP server's own cost would cap the rate, and the question is what
    the console costs at a given rate of traffic."""

    def __init__(self, service: ChatService, rate: float, direct: bool) -> None:
        """`direct`: record each request's start and end straight into the recorder (its prompt
        tokenized once up front) instead of running the serving pipeline."""
        self.service, self.rate, self.direct = service, rate, direct
        self.num_sent = self.num_done = 0
        self.latencies_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(30)
        return time.monotonic() - self.started

    async def _run(self) -> None:
        tasks = set()
        next_at = time.monotonic()
        while not self._stop.is_set():
            task = asyncio.create_task(self._one(self.num_sent))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            self.num_sent += 1
            next_at += 1 / self.rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, i: int) -> None:
        if self.direct:
            await self._recorded(i)
            return
        question = f"Task {i % 50}: fix the failing test number {i}."
        request = ChatRequest(
            messages=(Message("system", (TextPart(SYSTEM),)), Message("user", (TextPart(question),))),
            options=GenerationOptions(max_tokens=16),
        )
        started = time.monotonic()
        async for _ in self.service.generate(self.service.prepare_chat(request)):
            pass
        self.latencies_ms.append((time.monotonic() - started) * 1000)
        self.num_done += 1

    async def _recorded(self, i: int) -> None:
        """One request as the recorder sees it: start, prefill progress, first token, end (~0.1 s)."""
        prompt = self.prefix + self.service.tokenize(
            f"Task {i % 50}: fix the failing test number {i}.", False
        )
        cached = len(self.prefix) // 16 * 16
        prefill = PrefillTracker(f"load-{i}", len(prompt))
        run = GenerationRun(None, prefill)  # type: ignore[arg-type]  # the recorder reads counters only
        started = time.monotonic()
        self.service.recorder.start(f"load-{i}", prompt, run)
        await asyncio.sleep(0.03)
        prefill.num_computed_tokens, prefill.num_cached_tokens = (len(prompt) + cached) // 2, cached
        await asyncio.sleep(0.03)
        run.num_cached_tokens = cached
        prefill.finish(cached)
        await asyncio.sleep(0.05)
        run.num_output_tokens, run._reason = 16, "stop"
        self.service.recorder.end(f"load-{i}")
        self.latencies_ms.append((time.monotonic() - started) * 1000)
        self.num_done += 1

    @property
    def prefix(self) -> list[int]:
        if not hasattr(self, "_prefix"):
            self._prefix = self.service.tokenize("<|im_start|>system\n" + SYSTEM, False)
        return self._prefix


def time_api(url: str, seconds: float) -> dict[str, dict[str, float]]:
    """Each console route in turn, as the page calls it, for `seconds`."""
    routes = {
        "requests (poll, after=last)": None,
        "cache": "/kvserve/v1/cache",
        "checkpoints by score": "/kvserve/v1/cache/checkpoints?sort=score&limit=100",
        "checkpoints by size desc": "/kvserve/v1/cache/checkpoints?sort=size&order=desc&limit=100",
    }
    times: dict[str, list[float]] = {name: [] for name in routes}
    last_seq = 0
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            for name, path in routes.items():
                path = path or f"/kvserve/v1/requests?after={last_seq}&limit=50"
                started = time.perf_counter()
                response = client.get(path)
                times[name].append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                if path.startswith("/kvserve/v1/requests"):
                    last_seq = response.json()["last_seq"]
            time.sleep(0.2)
    return {name: percentiles(values) for name, values in times.items()}


LONG_TASKS = """
window.kvserveLongTasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.kvserveLongTasks.push(e.duration); })
  .observe({ type: "longtask", buffered: true });
"""


def time_page(
    url: str, chromium: str, seconds: float, screenshot: Path | None, total: int
) -> dict[str, object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        page = context.new_page()
        page.add_init_script(LONG_TASKS)
        started = time.perf_counter()
        page.goto(f"{url}/#cache")
        rows = min(100, total)
        page.wait_for_function(
            f"document.querySelectorAll('#checkpoints tbody tr').length === {rows}", timeout=60_000
        )
        page.wait_for_function("document.querySelectorAll('#recent tbody tr').length > 0", timeout=60_000)
        first_render_ms = (time.perf_counter() - started) * 1000
        seq_start = int(page.locator("#recent tbody tr td").first.inner_text())
        time.sleep(seconds)
        seq_end = int(page.locator("#recent tbody tr td").first.inner_text())
        if screenshot is not None:
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshot), full_page=False)
        sort_started = time.perf_counter()
        page.click("#checkpoints th[data-sort=size]")
        page.wait_for_function("document.getElementById('ckpt-count').textContent.includes('by size')")
        sort_ms = (time.perf_counter() - sort_started) * 1000
        stats = page.evaluate("window.kvserveConsoleStats")
        long_tasks = page.evaluate("window.kvserveLongTasks")
        rows = page.evaluate("document.querySelectorAll('#recent tbody tr').length")
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : null")
        context.close()
    return {
        "first_render_ms (nav to checkpoint rows (100 shown) + recent rows)": round(first_render_ms, 1),
        "poll_ms (fetch + render)": {kind: percentiles(values) for kind, values in stats.items()},
        "recent_requests_seen_during_window": seq_end - seq_start,
        "recent_rows_shown": rows,
        "long_tasks_over_50ms": {
            "count": len(long_tasks),
            "total_ms": round(sum(long_tasks), 1),
            "max_ms": round(max(long_tasks, default=0.0), 1),
        },
        "sort_click_to_rerender_ms": round(sort_ms, 1),
        "js_heap_mb": None if heap is None else round(heap / 2**20, 1),
        "checkpoints_total": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="chat requests per second")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each measuring window")
    parser.add_argument(
        "--traffic",
        choices=("recorder", "pipeline"),
        default="recorder",
        help="recorder: start/end straight into the recorder; pipeline: ChatService over a scripted engine",
    )
    parser.add_argument(
        "--recorder-only", action="store_true", help="only time the recorder's per-request cost (seconds)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the prefill tracker logs each request at INFO
    recorder_cost = time_recorder()
    if args.recorder_only:
        print(json.dumps({"recorder_cost_per_request": recorder_cost, "load_average_1m": os.getloadavg()[0]}))
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory(prefix="kvserve-console-load-") as directory:
        started = time.perf_counter()
        store = fill_store(Path(directory), args.checkpoints)
        print(
            f"store: {args.checkpoints} checkpoints in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
        service = ChatService(
            ScriptedEngine(reply("Done: it passes.")),
            FakeTokenizerInfo(),
            ChatServiceSettings(model_name="m", max_model_len=8192),
        )
        pool = BlockPoolView(16, 8192, 0, 0, 8192)
        disk = DiskViewCache(store)
        app = create_app(service, cache_view=lambda: CacheView(pool, disk.get()),
                         checkpoint_tokens=store.token_ids)  # fmt: skip
        with serve_in_thread(app) as (url, _):
            traffic = Traffic(service, args.rate, direct=args.traffic == "recorder")
            traffic.start()
            time.sleep(2)  # a backlog of recent requests first
            api = time_api(url, args.seconds)
            page = (
                time_page(url, chromium, args.seconds, args.screenshot, args.checkpoints)
                if chromium
                else None
            )
            elapsed = traffic.stop()
        store.close()
    result = {
        "checkpoints": args.checkpoints,
        "traffic": args.traffic,
        "target_rate": args.rate,
        "achieved_rate": round(traffic.num_done / elapsed, 1),
        "request_latency_ms": percentiles(traffic.latencies_ms),
        "recorder_cost_per_request": recorder_cost,
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        "cpu_count": os.cpu_count(),
        "api_ms": api,
        "page": page if page is not None else "skipped: no Chromium",
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
