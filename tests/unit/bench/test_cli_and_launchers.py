"""Subcommand wiring and the server launch commands (nothing is started)."""

from __future__ import annotations

import math
import pathlib

import gguf
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
    # Sampled as the peer samples: no preset penalties (the flags after it may bring them back).
    assert ["--generation-config", "none"] == cmd[cmd.index("--generation-config") :][:2]
    assert no_cache.spec.command(8123)[-1] == "--no-kv-cache"
    assert plain.rules.require_usage and plain.spec.env()["OMP_NUM_THREADS"]
    with pytest.raises(ValueError, match="unknown target"):
        launch_targets(["vllm"], options)


def test_llama_cpp_python_command_queues_instead_of_interrupting() -> None:
    spec = ServerSpec(
        "llama-cpp-python",
        ServerKind.LLAMA_CPP_PYTHON,
        "/m.gguf",
        8192,
        threads=2,
        extra_args=("--cache", "True"),
    )
    cmd = spec.command(9000)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    i = cmd.index("--interrupt_requests")
    assert cmd[i + 1] == "False"
    assert cmd[cmd.index("--n_threads") + 1] == "2" and cmd[cmd.index("--n_ctx") + 1] == "8192"
    assert cmd[-2:] == ["--cache", "True"]


def _value(cmd: list[str], flag: str) -> str:
    assert cmd.count(flag) == 1, cmd
    return cmd[cmd.index(flag) + 1]


def test_llama_server_gets_one_context_per_slot_and_kvserves_threads() -> None:
    options = LaunchOptions("smollm2", 2048, 2, 16, llama_args="--cache-reuse 256")
    llama, kvserve = launch_targets(["llama-server", "kvserve"], options)
    cmd = llama.spec.command(9000)
    assert cmd[0] == llama.spec.executable and _value(cmd, "--model").endswith(".gguf")
    # llama-server splits --ctx-size across its slots: 16 slots of 2048 each.
    assert _value(cmd, "--ctx-size") == str(2048 * 16) and _value(cmd, "--parallel") == "16"
    assert _value(cmd, "--threads") == _value(cmd, "--threads-batch") == "2"
    assert "--cont-batching" in cmd and _value(cmd, "--port") == "9000"
    assert "--jinja" in cmd  # SmolLM2's GGUF carries its chat template
    assert cmd[-2:] == ["--cache-reuse", "256"]
    assert llama.rules.require_usage  # the C++ server reports usage (and cached tokens) in streams
    assert _value(kvserve.spec.command(9001), "--ctx") == "2048"


def _header_only_gguf(path: pathlib.Path, context_length: int | None) -> pathlib.Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    if context_length is not None:
        writer.add_context_length(context_length)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_llama_server_context_defaults_to_the_models_and_one_slot(tmp_path: pathlib.Path) -> None:
    [smollm2] = launch_targets(["llama-server"], LaunchOptions("smollm2", 0, 1, None))
    cmd = smollm2.spec.command(9000)
    assert _value(cmd, "--ctx-size") == "8192" and _value(cmd, "--parallel") == "1"
    bare = _header_only_gguf(tmp_path / "bare.gguf", context_length=4096)
    [llama] = launch_targets(["llama-server"], LaunchOptions(str(bare), 0, 1, 3))
    bare_cmd = llama.spec.command(9000)
    assert _value(bare_cmd, "--ctx-size") == str(3 * 4096) and "--jinja" not in bare_cmd  # no template
    nameless = _header_only_gguf(tmp_path / "nameless.gguf", context_length=None)
    with pytest.raises(ValueError, match="pass --ctx"):
        launch_targets(["llama-server"], LaunchOptions(str(nameless), 0, 1, None))
    [explicit] = launch_targets(["llama-server"], LaunchOptions(str(nameless), 1024, 1, None))
    assert _value(explicit.spec.command(9000), "--ctx-size") == "1024"


def test_llama_server_refuses_a_model_that_is_not_gguf(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs a GGUF"):
        launch_targets(["llama-server"], LaunchOptions(str(folder), 2048, 1, None))


def test_llama_server_is_unavailable_until_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvserve.bench import targets

    [llama] = launch_targets(["llama-server"], LaunchOptions("smollm2", 2048, 1, 4))
    monkeypatch.setattr(targets, "find_llama_server", lambda: None)
    assert "make bench-peer" in (targets.unavailable_reason(llama) or "")
    monkeypatch.setattr(targets, "find_llama_server", lambda: pathlib.Path("/bin/true"))
    assert targets.unavailable_reason(llama) is None


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
