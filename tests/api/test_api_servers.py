"""`kvserve serve --api-servers 2`: two API front-end processes over one engine process (issue 21).

A tiny random-weight llama with a byte-level tokenizer, served for real (processes, sockets,
signals): both front ends serve, /metrics counts the whole server, a stream whose client leaves is
aborted, a front end that dies takes only its own requests with it, and SIGTERM ends everything."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.models.helpers import save_tiny_hf_model
from tests.serve_process import start_server, stop_server

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-servable")
    model = save_tiny_hf_model("llama_tied", path, seed=3)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    assert len(tokenizer) <= model.config.vocab_size
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def _body(max_tokens: int, stream: bool = False) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _chat(url: str, max_tokens: int) -> str:
    async with httpx.AsyncClient(timeout=120) as client:  # a connection of its own
        response = await client.post(f"{url}/v1/chat/completions", json=_body(max_tokens))
        response.raise_for_status()
        return response.json()["choices"][0]["message"]["content"]


async def _leave_mid_stream(url: str) -> None:
    body = _body(1500, True)
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"content"' in line:
                return  # the connection closes with the block: a disconnect


def _wait_idle(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _busy(url):
        assert time.monotonic() < deadline, "the engine still runs requests nobody reads"
        time.sleep(0.2)


def _busy(url: str) -> float:
    """Running + waiting sequences. Right after a front end is killed, a connection the kernel had
    already queued on its listening socket (SO_REUSEPORT picks one per connection) is reset: asked
    again, the next connection goes to a live front end."""
    for attempt in range(5):
        try:
            return _metric(url, "kvserve_num_running_seqs") + _metric(url, "kvserve_num_waiting_seqs")
        except (httpx.ReadError, httpx.ConnectError, httpx.RemoteProtocolError):
            if attempt == 4:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def _console(url: str) -> dict:
    return httpx.get(f"{url}/kvserve/v1/requests", params={"limit": 100}, timeout=30).json()


def _pids(log: Path) -> list[int]:
    found = re.search(r"over one engine \(--api-servers\): pids ([\d ]+)", log.read_text())
    assert found, log.read_text()[-3000:]
    return [int(pid) for pid in found.group(1).split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_front_ends_over_one_engine(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    args = ["--model", str(model_dir), "--device", "cpu", "--dtype", "float32", "--ctx", "2048"]
    args += ["--no-kv-cache", "--engine-process", "on", "--api-servers", "2", "--max-num-seqs", "16"]
    process, url = start_server(args, log, timeout_s=600)
    try:
        parent, child = _pids(log)

        async def many() -> list[str]:
            return await asyncio.gather(*(_chat(url, 12) for _ in range(16)))

        texts = asyncio.run(many())
        assert len(set(texts)) == 1 and texts[0]  # greedy: one answer, whichever front end served it
        served = log.read_text()
        assert "[api 1]: request_id" in served and re.search(r"kvserve.access: request_id", served)
        assert _metric(url, 'kvserve_http_requests_total{path="/v1/chat/completions"') == 16
        assert _metric(url, "kvserve_generation_tokens_total") == 16 * 12
        deadline = time.monotonic() + 10  # front end 1's records reach front end 0 through the engine
        while _console(url)["last_seq"] < 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Whichever front end answers (a new connection each: SO_REUSEPORT spreads them; the console's
        # routes are logged at debug level only), the console has every request.
        for _ in range(10):
            listed = _console(url)
            assert len(listed["recent"]) == 16 and listed["last_seq"] == 16
            one = listed["recent"][0]["request_id"]
            assert httpx.get(f"{url}/kvserve/v1/requests/{one}", timeout=30).json()["request_id"] == one
            hits = httpx.get(f"{url}/kvserve/v1/cache", timeout=30).json()["hit_rate"]
            assert sum(b["num_requests"] for b in hits) == 16

        async def leave() -> None:
            await asyncio.wait_for(asyncio.gather(*(_leave_mid_stream(url) for _ in range(6))), 120)

        asyncio.run(leave())
        _wait_idle(url)  # every abandoned stream was aborted, on either front end

        async def kill_mid_stream() -> None:
            streams = [asyncio.create_task(_chat(url, 300)) for _ in range(6)]
            await asyncio.sleep(1.0)
            os.kill(child, signal.SIGKILL)
            await asyncio.gather(*streams, return_exceptions=True)

        asyncio.run(kill_mid_stream())
        _wait_idle(url)  # the dead front end's requests were aborted; the other's finished
        assert process.poll() is None and "API front end 1 exited" in log.read_text()
        assert asyncio.run(_chat(url, 4))  # front end 0 still serves, alone now
    except BaseException:
        process.kill()
        process.wait()
        raise
    stop_server(process, log)
    deadline = time.monotonic() + 30
    while _alive(parent) or _alive(child):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "Traceback" not in log.read_text()


def test_metrics_of_front_ends_sum_per_sample() -> None:
    from prometheus_client import generate_latest

    from kvserve.api.metrics import Metrics

    other = Metrics()
    other.count_request("/health", 200)
    other.count_request("/metrics", 200)
    other.ttft.observe(0.3)
    other.generations_in_flight.inc()
    scraped = Metrics(peers=lambda: [other.snapshot(), None])  # None: a front end that did not answer
    scraped.count_request("/health", 200)
    scraped.ttft.observe(0.07)
    text = generate_latest(scraped.registry).decode()
    assert 'kvserve_http_requests_total{path="/health",status="200"} 2.0' in text
    assert 'kvserve_http_requests_total{path="/metrics",status="200"} 1.0' in text
    assert "kvserve_generations_in_flight 1.0" in text
    assert "kvserve_time_to_first_token_seconds_count 2.0" in text
    assert 'kvserve_time_to_first_token_seconds_bucket{le="0.1"} 1.0' in text
    assert text.count("# TYPE kvserve_http_requests_total counter") == 1


def test_front_end_questions_are_answered_by_type() -> None:
    """Front ends answer each other's typed questions: metrics and live requests from every front
    end, the console's questions from front end 0 only (as a `PrimaryAnswer`), and an unknown
    question is an error, not a silent None."""
    from types import SimpleNamespace

    from kvserve.api.front_end_questions import ConsoleHitRate, LiveRequests, MetricsSnapshot, PrimaryAnswer
    from kvserve.cli.api_servers import _answer

    recorder = SimpleNamespace(live=lambda: ["in flight"], hit_rate_series=lambda: [0.5])
    app = SimpleNamespace(
        state=SimpleNamespace(
            metrics=SimpleNamespace(snapshot=lambda: {"n": 1}), console=SimpleNamespace(recorder=recorder)
        )
    )
    assert _answer(app, 1, MetricsSnapshot()) == {"n": 1}
    assert _answer(app, 1, LiveRequests()) == ["in flight"]
    assert _answer(app, 1, ConsoleHitRate()) is None
    assert _answer(app, 0, ConsoleHitRate()) == PrimaryAnswer([0.5])
    with pytest.raises(LookupError, match="unknown front-end question"):
        _answer(app, 0, "console_hit_rate")
