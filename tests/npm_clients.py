"""Real coding clients (Claude Code, Codex, OpenCode, pi) installed from npm for the end-to-end tests: pinned, once
per version under pytest's cache directory, or a skip that says why (no Node/npm, no network)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# npm's words for a registry it cannot reach; any other install failure is a real failure.
_OFFLINE = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNREFUSED|ECONNRESET|ENETUNREACH|network", re.IGNORECASE
)


@dataclass(frozen=True)
class NpmClient:
    package: str
    version: str
    binary: str  # its command under node_modules/.bin

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


CLAUDE_CODE = NpmClient("@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = NpmClient("@openai/codex", "0.171.0", "codex")
PI = NpmClient("@mariozechner/pi-coding-agent", "0.73.1", "pi")
OPENCODE = NpmClient("opencode-ai", "1.18.33", "opencode")


# The user's own client settings and keys, which a client run on a fresh home must not see.
_USER_SETTINGS = (
    "ANTHROPIC_",
    "CLAUDE_",
    "OPENAI_",
    "CODEX_",
    "OPENCODE_",
    "XDG_CONFIG_",
    "XDG_DATA_",
    "XDG_STATE_",
)


def client_env(home: Path) -> dict[str, str]:
    """This environment without the user's client settings and keys, with `home` as the client's home
    (its config and data under it: XDG's config, data and state folders default to it)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_USER_SETTINGS)} | {"HOME": str(home)}


def opencode_config(base_url: str, context: int) -> dict:
    """The README's OpenCode provider block (`~/.config/opencode/opencode.json`): kvserve as an
    OpenAI-compatible provider, its context told so that OpenCode compacts a session before it."""
    model = {"name": "SmolLM2 135M", "limit": {"context": context, "output": 4096}}
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "kvserve": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "kvserve (local)",
                "options": {"baseURL": base_url},
                "models": {"smollm2": model},
            }
        },
        "model": "kvserve/smollm2",
        "autoupdate": False,
        "share": "disabled",
    }


def installed_client(client: NpmClient, cache_dir: Path, timeout_s: float = 600) -> Path:
    """The client's executable, installed into `cache_dir/<package>@<version>` on first use."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH: the real-client tests need Node.js and npm")
    folder = cache_dir / client.spec.replace("/", "+")
    executable = folder / "node_modules" / ".bin" / client.binary
    if executable.exists():
        return executable
    shutil.rmtree(folder, ignore_errors=True)  # a folder without the executable is a broken install
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Installed beside the final folder and renamed into place: an interrupted install is never reused.
    staging = Path(tempfile.mkdtemp(prefix=".installing-", dir=cache_dir))
    command = ["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        result = subprocess.run(
            [*command, client.spec],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_npm_env(),
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"npm install {client.spec} took over {timeout_s:.0f} s (no network?)")
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = (result.stdout + result.stderr).strip()
        if _OFFLINE.search(output):
            pytest.skip(f"npm install {client.spec} failed, the registry is unreachable: {output[-300:]}")
        raise AssertionError(f"npm install {client.spec} failed ({result.returncode}):\n{output[-3000:]}")
    staging.rename(folder)
    return executable


def _npm_env() -> dict[str, str]:
    # The suite points XDG_CACHE_HOME at a temporary directory; npm's own cache (~/.npm) stays shared.
    return {**os.environ, "npm_config_update_notifier": "false"}
