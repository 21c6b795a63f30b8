"""Subcommand wiring and the server launch commands (nothing is started)."""

from __future__ import annotations

import math

import pytest

from kvserve.bench.peers import ServerKind, ServerSpec
from kvserve.bench.targets import LaunchOptions, launch_targets
from kvserve.cli.main import _build_parser


def test_bench_subcommands_parse() -> None:
    parser = _build_parser()
    engine = parser.parse_args(["bench", "engine", "--no-peer"])
    assert engine.bench_command == "engine"
    serve = parser.parse_args(
        ["bench", "serve", "--url", "http://x", "--request-rate", "inf", "--max-concurrency", "16"]
    )
    assert serve.workload == "serve" and math.isinf(serve.request_rate) and serve.max_concurrency == 16
    assert serve.targets == "kvserve" and serve.out is None
    compare = parser.parse_args(
        ["bench", "compare", "multiturn", "--restart-after", "4", "--model", "gemma3-270m"]
    )
    assert compare.workload == "multiturn" and compare.restart_after == 4
    assert compare.targets == "kvserve-disk,kvserve-no-kv-cache,llama-server"
    assert str(compare.out) == "docs/benchmarks"
    context = parser.parse_args(["bench", "compare", "context", "--frontiers", "512,1024"])
    assert context.workload == "context" and context.api == "completions"


def test_kvserve_commands_pass_extra_flags_through() -> None:
    options = LaunchOptions("smollm2", 8192, 2, 16, kvserve_args="--weight-quant int4 --dtype bfloat16")
    plain, no_cache = launch_targets(["kvserve", "kvserve-no-kv-cache"], options)
    cmd = plain.spec.command(8123)
    assert cmd[1:4] == ["-m", "kvserve", "serve"]
    assert ["--ctx", "8192"] == cmd[cmd.index("--ctx") : cmd.index("--ctx") + 2]
    assert "--max-num-seqs" in cmd and cmd[-4:] == ["--weight-quant", "int4", "--dtype", "bfloat16"]
    assert no_cache.spec.command(8123)[-1] == "--no-kv-cache"
    assert plain.rules.require_usage and plain.spec.env()["OMP_NUM_THREADS"]
    with pytest.raises(ValueError, match="unknown target"):
        launch_targets(["vllm"], options)


def test_llama_server_command_queues_instead_of_interrupting() -> None:
    spec = ServerSpec(
        "llama-server", ServerKind.LLAMA_SERVER, "/m.gguf", 8192, threads=2, extra_args=("--cache", "True")
    )
    cmd = spec.command(9000)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    i = cmd.index("--interrupt_requests")
    assert cmd[i + 1] == "False"
    assert cmd[cmd.index("--n_threads") + 1] == "2" and cmd[cmd.index("--n_ctx") + 1] == "8192"
    assert cmd[-2:] == ["--cache", "True"]


@pytest.mark.parametrize("has_disk_tier", [True, False])
def test_fresh_cache_dir_only_when_kvserve_has_the_disk_tier(
    monkeypatch: pytest.MonkeyPatch, has_disk_tier: bool
) -> None:
    from kvserve.bench import targets
    from kvserve.bench.peers import ServerStartError

    monkeypatch.setattr(targets, "kvserve_has_option", lambda name: has_disk_tier)
    options = LaunchOptions("smollm2", 2048, 2, None)
    plain, disk, no_cache = launch_targets(["kvserve", "kvserve-disk", "kvserve-no-kv-cache"], options)
    assert targets._wants_fresh_cache_dir(plain) is has_disk_tier
    assert not targets._wants_fresh_cache_dir(no_cache)
    if has_disk_tier:
        assert targets._wants_fresh_cache_dir(disk)
    else:
        with pytest.raises(ServerStartError, match="no --kv-cache-dir"):
            targets._wants_fresh_cache_dir(disk)
