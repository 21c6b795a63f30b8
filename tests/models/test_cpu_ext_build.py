"""Where the CPU kernels are built: one folder per source content and compile command, whatever
checkout they come from, and a second start that finds them built does not compile them again."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.models.layers import cpu_ext

KEY = ("c++", "-O3", "-fopenmp", "2.13.0+cpu", "/venv/torch/include")


def _checkout(root: Path, body: str) -> Path:
    csrc = root / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "a.cpp").write_text(body)
    (csrc / "k.h").write_text("// header\n")
    (csrc / "notes.txt").write_text("not a source")
    return csrc


def test_two_checkouts_of_the_same_sources_share_one_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    first = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"), KEY)
    second = cpu_ext._build_folders(_checkout(tmp_path / "two", "int f();\n"), KEY)
    assert first == second
    name, src, build = first
    assert src.parent == build.parent == tmp_path / "cache" / name and build.is_dir()
    assert sorted(p.name for p in src.iterdir()) == ["a.cpp", "k.h"]  # copied; other files left out
    assert [p.name for p in src.parent.iterdir() if p.name.startswith("src-")] == []  # no staging left


def test_changed_sources_build_in_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    old, _, _ = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"), KEY)
    new, src, _ = cpu_ext._build_folders(_checkout(tmp_path / "two", "int g();\n"), KEY)
    assert old != new and (src / "a.cpp").read_text() == "int g();\n"


@pytest.mark.parametrize(
    "other",
    [
        KEY[:-1] + ("/elsewhere/.venv/lib/python3/site-packages/torch/include",),  # a second virtualenv
        ("c++", "-O2", "-fopenmp", "2.13.0+cpu", "/venv/torch/include"),  # other flags
        ("c++", "-O3", "-fopenmp", "2.12.0+cpu", "/venv/torch/include"),  # another torch
        ("clang++", "-O3", "-fopenmp", "2.13.0+cpu", "/venv/torch/include"),  # CXX names another compiler
    ],
)
def test_another_compile_command_builds_in_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: tuple[str, ...]
) -> None:
    """Two installations on one machine (other include paths, flags or torch in the command) must not
    share a build folder, or each start rebuilds the other's kernels."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    here, _, _ = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"), KEY)
    there, _, _ = cpu_ext._build_folders(_checkout(tmp_path / "two", "int f();\n"), other)
    again, _, _ = cpu_ext._build_folders(_checkout(tmp_path / "three", "int f();\n"), other)
    assert here != there == again


def test_the_compile_key_names_this_installation(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    import torch
    from torch.utils.cpp_extension import include_paths

    monkeypatch.delenv("CXX", raising=False)
    key = cpu_ext.compile_key()
    assert key == cpu_ext.compile_key()
    assert {"c++", torch.__version__, *include_paths(), sysconfig.get_paths()["include"]} <= set(key)
    assert set(cpu_ext._CFLAGS) <= set(key) and sysconfig.get_config_var("EXT_SUFFIX") in key
    monkeypatch.setenv("CXX", "clang++")
    assert cpu_ext.compile_key()[0] == "clang++"


def test_a_second_start_loads_the_built_kernels_without_compiling() -> None:
    """What the issue measured (2 min 40 s of compiling in a start that should have loaded them):
    a fresh process with the same installation finds the objects and the module up to date."""
    import subprocess
    import sys

    if cpu_ext.load() is None:
        pytest.skip("no AVX2 CPU kernels here")
    name, _, build = cpu_ext._build_folders(Path(cpu_ext.__file__).with_name("csrc"), cpu_ext.compile_key())
    built = sorted([*build.glob("*.o"), build / f"{name}.so"])
    before = [path.stat().st_mtime_ns for path in built]
    loader = "from kvserve.models.layers import cpu_ext; print(cpu_ext.load().__file__)"
    loaded = subprocess.run(
        [sys.executable, "-c", loader], check=True, timeout=120, capture_output=True, text=True
    )
    assert Path(loaded.stdout.strip()) == build / f"{name}.so"  # the same folder: the key is stable
    assert [path.stat().st_mtime_ns for path in built] == before  # and nothing in it was compiled again


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    _, _, build = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"), KEY)
    (build / "lock").write_text("")  # what torch's FileBaton leaves when its process is killed
    with cpu_ext._build_lock(build):
        assert not (build / "lock").exists()


def test_a_second_builder_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    _, _, build = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"), KEY)
    waiter = (
        "import sys, time; from pathlib import Path; from kvserve.models.layers import cpu_ext\n"
        "start = time.monotonic()\n"
        "with cpu_ext._build_lock(Path(sys.argv[1])): print(time.monotonic() - start)\n"
    )
    with cpu_ext._build_lock(build):
        other = subprocess.Popen(
            [sys.executable, "-c", waiter, str(build)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(1.5)
    waited = float(other.communicate(timeout=60)[0])
    assert waited >= 1.0


def test_the_kernels_run_on_the_threads_torch_is_given() -> None:
    """at::parallel_for is OpenMP in torch's CPU builds and serial in code compiled without -fopenmp:
    every kernel ran on one thread whatever --threads said, until the build passed the flag."""
    import torch

    ext = cpu_ext.load()
    if ext is None:
        pytest.skip("no AVX2 CPU kernels here")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ext.parallel_width(64) == 2  # fails on a serial build (1), whatever the machine
        torch.set_num_threads(1)
        assert ext.parallel_width(64) == 1
    finally:
        torch.set_num_threads(threads)


def test_a_confined_thread_runs_its_parallel_regions_alone() -> None:
    """kvserve/openmp.py: a helper thread (the disk tier's writer) gets no OpenMP team of its own,
    while the other threads keep theirs."""
    import threading

    import torch

    from kvserve.openmp import confine_to_one_thread

    ext = cpu_ext.load()
    if ext is None:
        pytest.skip("no AVX2 CPU kernels here")
    threads = torch.get_num_threads()
    widths: list[int] = []

    def helper() -> None:
        ext.parallel_width(1)  # the extension's own per-thread OpenMP set-up, which runs once
        assert confine_to_one_thread()
        widths.append(torch.get_num_threads())  # what torch's own ops get on this thread
        widths.append(ext.parallel_width(64))

    try:
        torch.set_num_threads(2)
        worker = threading.Thread(target=helper)
        worker.start()
        worker.join()
        assert widths == [1, 1]
        assert ext.parallel_width(64) == 2 and torch.get_num_threads() == 2  # this thread is not confined
    finally:
        torch.set_num_threads(threads)
