"""Claude Code, Codex and OpenCode as a user installs them, run N times each against a running `make serve`:
the pinned npm versions the suite uses (tests/npm_clients.py), their default set-ups (Claude Code
`-p` without `--bare`, told only ANTHROPIC_BASE_URL and a dummy key; Codex with the README's
provider block; OpenCode with the README's opencode.json), a few one-line questions in turn, all runs in one project folder as a user's
would be. Reports each run's exit status and wall time, and the share that exited 0.

    make serve &                                   # in another terminal: 127.0.0.1:8000
    .venv/bin/python scripts/clients_as_installed.py --runs 20 --json docs/benchmarks/clients-20.json

Figures: docs/clients.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.npm_clients import CLAUDE_CODE, CODEX, OPENCODE, client_env, installed_client, opencode_config

QUESTIONS = (
    "Say hello.",
    "What is the capital of France?",
    "What does the ls command do?",
    "Name three sorting algorithms.",
)
CODEX_CONFIG = """model = "smollm2"
model_provider = "kvserve"
model_context_window = {ctx}

[model_providers.kvserve]
name = "kvserve (local)"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "KVSERVE_API_KEY"
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--clients", default="claude,codex,opencode")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a run counts as hung")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    cache = ROOT / ".pytest_cache" / "d" / "kvserve-test-clients"  # where the suite installs them
    work = Path(tempfile.mkdtemp(prefix="kvserve-clients-"))
    home, project = work / "home", work / "project"
    home.mkdir()
    project.mkdir()
    base_env = client_env(home)
    results: dict[str, list[dict]] = {}
    for name in args.clients.split(","):
        if name == "claude":
            binary = installed_client(CLAUDE_CODE, cache)
            env = base_env | {"ANTHROPIC_BASE_URL": args.url, "ANTHROPIC_API_KEY": "dummy"}
            command = [str(binary), "-p"]
        elif name == "codex":
            binary = installed_client(CODEX, cache)
            codex_home = work / "codex-home"
            codex_home.mkdir()
            ctx = httpx.get(f"{args.url}/v1/models").json()["data"][0]["context_length"]
            (codex_home / "config.toml").write_text(CODEX_CONFIG.format(url=args.url, ctx=ctx))
            env = base_env | {"CODEX_HOME": str(codex_home), "KVSERVE_API_KEY": "dummy"}
            command = [str(binary), "exec", "--skip-git-repo-check"]
        elif name == "opencode":
            binary = installed_client(OPENCODE, cache)
            ctx = httpx.get(f"{args.url}/v1/models").json()["data"][0]["context_length"]
            config = home / ".config" / "opencode" / "opencode.json"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(json.dumps(opencode_config(f"{args.url}/v1", ctx), indent=2))
            env = base_env
            command = [str(binary), "run"]
        else:
            parser.error(f"unknown client {name!r}")
        results[name] = [
            _run(name, [*command, QUESTIONS[i % len(QUESTIONS)]], env, project, args.timeout, i)
            for i in range(args.runs)
        ]
    for name, runs in results.items():
        ok = [r for r in runs if r["exit"] == 0]
        walls = [r["seconds"] for r in runs]
        print(
            f"{name}: {len(ok)}/{len(runs)} exited 0 ({100 * len(ok) / len(runs):.0f}%); wall s: first {walls[0]:.1f}, "
            f"later median {statistics.median(walls[1:] or walls):.1f}, max {max(walls[1:] or walls):.1f}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"url": args.url, "questions": QUESTIONS, "runs": results}, indent=1) + "\n"
        )


def _run(name: str, command: list[str], env: dict[str, str], cwd: Path, timeout: float, index: int) -> dict:
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            check=False,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        status, output = done.returncode, (done.stdout.strip() or done.stderr.strip())
    except subprocess.TimeoutExpired:
        status, output = "hung", ""
    run = {
        "exit": status,
        "seconds": round(time.monotonic() - started, 1),
        "question": command[-1],
        "answer": output[-300:],
    }
    print(
        f"{name} run {index + 1:2d}: exit {status}, {run['seconds']} s: {json.dumps(output[-160:])}",
        flush=True,
    )
    return run


if __name__ == "__main__":
    main()
