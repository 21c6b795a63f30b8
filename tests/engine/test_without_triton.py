"""The CPU engine never needs Triton: pyproject.toml installs it on Linux x86_64 only, so on macOS or
an aarch64 Linux `kvserve serve` runs without it. A subprocess where `import triton` fails (as
where it is not installed) generates what this process's engine generates."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.engine.conftest import make_engine
from tests.engine.test_engine_core import _prompt, _run
from tests.serve_process import child_env

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
sys.modules["triton"] = None  # `import triton` now raises ImportError, as where it is not installed
from pathlib import Path
from tests.engine.conftest import make_engine
from tests.engine.test_engine_core import _prompt, _run
tokens, _ = _run(make_engine(Path(sys.argv[1]), weight_quant=sys.argv[2]), [_prompt(40, 1), _prompt(300, 2)])
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "triton" and sys.modules[name] is not None)
print(json.dumps({"tokens": tokens, "triton_modules": loaded}))
"""


@pytest.mark.parametrize("weight_quant", ["none", "int4"])
def test_cpu_generation_runs_where_triton_cannot_be_imported(tiny_llama_dir: Path, weight_quant: str) -> None:
    want, _ = _run(make_engine(tiny_llama_dir, weight_quant=weight_quant), [_prompt(40, 1), _prompt(300, 2)])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(tiny_llama_dir), weight_quant],
        check=False, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"tokens": want, "triton_modules": []}
