"""`kvserve kv ls|show|prune|verify|rm` over a store built through the real CheckpointStore."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvstore_helpers import Clock, make_identity, model_dir, open_store, random_tokens, save, text_of

from kvserve.cli.main import main
from kvserve.kvstore.cache_dir import DirLock
from kvserve.kvstore.checkpoint import TextKey

DAY = 86400.0
MIB = 1 << 20


def cid(token_ids: list[int]) -> str:
    return TextKey.of(text_of(token_ids)).sha1


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, dict[str, list[int]]]:
    """Three checkpoints sharing a 48-token prefix: an old cold one, a used continued one, a recent evict one."""
    directory = tmp_path / "kv"
    clock = Clock(time.time() - 10 * DAY)
    store = open_store(directory, clock=clock)
    base = random_tokens(64, 1)
    convs = {
        "cold": base,
        "continued": base + random_tokens(30, 2),
        "evict": base[:48] + random_tokens(20, 3),
    }
    save(store, convs["cold"], "cold")
    clock.now += 5 * DAY
    save(store, convs["continued"], "continued")
    store.touch(cid(convs["continued"]), hit=True)
    clock.now += 5 * DAY - 60
    save(store, convs["evict"], "evict")
    store.close()
    return directory, convs


def kv(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["kv", *args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def files_bytes(directory: Path) -> int:
    """Manifests and chunks of every model subdirectory (what `ls` totals and the budget count)."""
    return sum(p.stat().st_size for sub in ("checkpoints", "chunks") for p in directory.glob(f"*/{sub}/*"))


def test_ls_lists_every_checkpoint_and_the_totals(cache, capsys) -> None:
    directory, convs = cache
    code, out, _ = kv(capsys, "ls", "--kv-cache-dir", str(directory))
    assert code == 0
    for reason, tokens in convs.items():
        row = next(line for line in out.splitlines() if cid(tokens)[:12] in line)
        assert reason in row and "test-model/bf16" in row
    assert "3 checkpoints of 1 models" in out and "8 unique chunks" in out
    code, out, _ = kv(capsys, "ls", "--kv-cache-dir", str(directory), "--json")
    document = json.loads(out)
    totals = document["totals"]
    assert (totals["num_checkpoints"], totals["num_unique_chunks"]) == (3, 8)
    assert totals["bytes_on_disk"] == files_bytes(directory) and totals["dedup_ratio"] > 1.5
    rows = {row["id"]: row for row in document["checkpoints"]}
    assert [row["reason"] for row in document["checkpoints"]] == [
        "evict",
        "continued",
        "cold",
    ]  # newest first
    continued = rows[cid(convs["continued"])]
    assert continued["hits"] == 1 and continued["effective_hits"] == 0.0  # 5 days = 20 half-lives
    assert continued["marginal_bytes"] < continued["total_bytes"]  # its first 4 chunks are shared


def test_show_prints_all_metadata_and_the_chunk_list(cache, capsys) -> None:
    directory, convs = cache
    checkpoint_id = cid(convs["continued"])
    code, out, _ = kv(capsys, "show", checkpoint_id[:8], "--kv-cache-dir", str(directory), "--json")
    record = json.loads(out)
    assert code == 0 and record["id"] == checkpoint_id and record["text_sha1"] == checkpoint_id
    assert record["text_bytes"] == len(text_of(convs["continued"]).encode()) and record["num_tokens"] == 94
    assert [(c["start"], c["end"], c["users"]) for c in record["chunks"]][:4] == [
        (0, 16, 3),
        (16, 32, 3),
        (32, 48, 3),
        (48, 64, 2),
    ]
    code, out, _ = kv(capsys, "show", checkpoint_id[:8], "--kv-cache-dir", str(directory))
    assert code == 0 and "text_sha1" in out and "6 chunks, 4 shared" in out


def test_unknown_ids_and_missing_directories_are_clear_errors(cache, capsys, tmp_path) -> None:
    directory, _ = cache
    for args in (
        ("show", "0000dead", "--kv-cache-dir", str(directory)),
        ("rm", "0000dead", "--kv-cache-dir", str(directory)),
        ("ls", "--kv-cache-dir", str(tmp_path / "nowhere")),
        ("verify", "--kv-cache-dir", str(tmp_path / "nowhere")),
        ("prune", "--kv-cache-dir", str(directory)),  # no criterion
        ("rm", "--kv-cache-dir", str(directory)),  # neither ids nor --all
    ):
        code, _, err = kv(capsys, *args)
        assert code == 1 and "error:" in err and "Traceback" not in err, args
    code, _, err = kv(capsys, "show", "", "--kv-cache-dir", str(directory))
    assert code == 1 and "ambiguous" in err
    assert len(list((model_dir(directory) / "checkpoints").iterdir())) == 3  # the failed rm removed nothing


def test_rm_removes_only_chunks_no_one_else_uses_and_keeps_the_index_in_step(cache, capsys) -> None:
    directory, convs = cache
    code, out, _ = kv(capsys, "rm", cid(convs["continued"])[:10], "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 1 checkpoints and 2 chunks" in out
    store = open_store(directory)
    assert {c.checkpoint_id for c in store.checkpoints()} == {cid(convs["cold"]), cid(convs["evict"])}
    assert store.load(cid(convs["cold"])) is not None and store.load(cid(convs["evict"])) is not None
    store.close()
    code, out, _ = kv(capsys, "rm", "--all", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 2 checkpoints and 6 chunks" in out
    assert files_bytes(directory) == 0


def test_editing_commands_refuse_while_a_server_holds_the_directory(cache, capsys) -> None:
    directory, _ = cache
    server = open_store(directory)  # an open store holds the directory's shared lock
    for args in (("rm", "--all"), ("prune", "--model", "test"), ("verify", "--fix")):
        code, _, err = kv(capsys, *args, "--kv-cache-dir", str(directory))
        assert code == 1 and "in use by a running kvserve server" in err, args
    code, out, _ = kv(capsys, "ls", "--kv-cache-dir", str(directory))  # reading is fine
    assert code == 0 and "3 checkpoints" in out
    server.close()
    assert kv(capsys, "prune", "--model", "test", "--dry-run", "--kv-cache-dir", str(directory))[0] == 0


def test_verify_finds_a_corrupt_chunk_an_orphan_and_another_models_entry_and_fix_removes_them(
    cache, capsys, tmp_path
) -> None:
    directory, convs = cache
    assert kv(capsys, "verify", "--kv-cache-dir", str(directory))[0] == 0
    store = open_store(directory)
    own_key = store.get(cid(convs["continued"])).chunks[-1].key
    store.close()
    chunk = model_dir(directory) / "chunks" / f"{own_key}.kvc"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0x40  # payload only: no header check can see it
    chunk.write_bytes(data)
    (model_dir(directory) / "chunks" / f"{'e' * 32}.kvc").write_bytes(b"orphan")
    (model_dir(directory) / "chunks" / f"{'a' * 32}.kvc.tmp.99.0").write_bytes(b"half")
    other_identity = make_identity(fingerprint="other-model:bfloat16:none")
    other = open_store(tmp_path / "other", other_identity)
    foreign = random_tokens(20, 9)
    save(other, foreign)
    other.close()
    name = f"{cid(foreign)}.kvm"
    source = model_dir(tmp_path / "other", other_identity) / "checkpoints" / name
    (model_dir(directory) / "checkpoints" / name).write_bytes(source.read_bytes())

    code, out, _ = kv(capsys, "verify", "--kv-cache-dir", str(directory))
    assert code == 1 and "5 problems" in out  # chunk + its user, foreign manifest, 2 orphans
    lines = out.splitlines()
    assert any("corrupt" in line and own_key[:16] in line for line in lines)
    assert any("corrupt" in line and cid(convs["continued"])[:16] in line for line in lines)
    assert any("incompatible" in line and cid(foreign)[:16] in line for line in lines)
    assert sum("orphan" in line for line in lines) == 2

    code, out, _ = kv(capsys, "verify", "--fix", "--kv-cache-dir", str(directory))
    assert code == 0 and "fixed" in out
    assert kv(capsys, "verify", "--kv-cache-dir", str(directory))[0] == 0
    store = open_store(directory)
    assert {c.checkpoint_id for c in store.checkpoints()} == {cid(convs["cold"]), cid(convs["evict"])}
    assert store.verify() == 0
    assert (
        len(list((model_dir(directory) / "chunks").iterdir())) == 6
    )  # the continued entry's own 2 chunks are gone


def test_prune_by_budget_follows_the_eviction_policy(cache, capsys) -> None:
    directory, convs = cache
    total = files_bytes(directory)
    budget_mb = (total - 1) / MIB  # one eviction is enough
    code, out, _ = kv(
        capsys, "prune", "--budget-mb", f"{budget_mb:.9f}", "--dry-run", "--kv-cache-dir", str(directory)
    )
    # continued is no anchor and its one hit has decayed over 5 days: it scores lowest
    assert code == 0 and "would remove " + cid(convs["continued"])[:12] in out
    assert files_bytes(directory) == total  # dry run
    code, out, _ = kv(capsys, "prune", "--budget-mb", f"{budget_mb:.9f}", "--kv-cache-dir", str(directory))
    assert code == 0 and files_bytes(directory) < total
    assert not (model_dir(directory) / "checkpoints" / f"{cid(convs['continued'])}.kvm").exists()
    code, _, err = kv(
        capsys, "prune", "--budget-mb", "0", "--model", "nomatch", "--kv-cache-dir", str(directory)
    )
    assert code == 1 and "nothing removed" in err


def test_prune_by_age_and_model(cache, capsys) -> None:
    directory, convs = cache
    code, out, _ = kv(capsys, "prune", "--older-than", "7d", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 1 checkpoints" in out
    assert not (model_dir(directory) / "checkpoints" / f"{cid(convs['cold'])}.kvm").exists()
    code, out, _ = kv(capsys, "prune", "--model", "other", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 0 checkpoints" in out
    code, out, _ = kv(capsys, "prune", "--model", "test-mo", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 2 checkpoints" in out
    with pytest.raises(SystemExit) as bad:
        main(["kv", "prune", "--older-than", "soon", "--kv-cache-dir", str(directory)])
    assert bad.value.code == 2  # argparse's usage error


def test_python_m_kvserve_kv_runs_as_a_process(cache, tmp_path) -> None:
    directory, _ = cache
    run = subprocess.run(
        [sys.executable, "-m", "kvserve", "kv", "ls", "--kv-cache-dir", str(directory)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "3 checkpoints" in run.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "kvserve", "kv", "verify", "--kv-cache-dir", str(tmp_path / "none")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    )


_NO_TORCH = """
import sys
from kvserve.cli.main import main
directory, checkpoint_id = sys.argv[1:]
for args in (["ls"], ["show", checkpoint_id], ["prune", "--dry-run", "--older-than", "1d"]):
    try:
        main(["kv", *args, "--kv-cache-dir", directory])
    except SystemExit as done:
        assert done.code == 0, (args, done.code)
assert "torch" not in sys.modules, "kvserve kv imported torch"
"""


def test_ls_show_and_prune_need_no_torch(cache) -> None:
    """They read headers, manifests and the index, never KV: a quick look at a cache starts fast."""
    directory, convs = cache
    subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(directory), cid(convs["cold"])],
        cwd=Path(__file__).resolve().parents[3],
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_verify_reports_a_missing_chunk_on_every_checkpoint_using_it(cache, capsys) -> None:
    directory, convs = cache
    store = open_store(directory)
    shared_key = store.get(cid(convs["cold"])).chunks[3].key  # [48, 64): cold and continued
    store.close()
    (model_dir(directory) / "chunks" / f"{shared_key}.kvc").unlink()
    code, out, _ = kv(capsys, "verify", "--kv-cache-dir", str(directory))
    assert code == 1 and out.count(f"its chunk {shared_key} is missing") == 2
    assert "1 checkpoints and 5 chunks verified" in out  # evict: the 3 shared chunks and its own 2
    assert kv(capsys, "verify", "--fix", "--kv-cache-dir", str(directory))[0] == 0
    assert [p.stem for p in (model_dir(directory) / "checkpoints").iterdir()] == [cid(convs["evict"])]


OTHER = make_identity(fingerprint="other-model:float32:none", dtype="float32")


@pytest.fixture
def two_models(cache) -> tuple[Path, dict[str, list[int]]]:
    """The three-checkpoint cache plus, in its own subdirectory, another model's checkpoint of
    the same conversation as `cold` (same text, so the same id) and one of its own."""
    directory, convs = cache
    store = open_store(directory, OTHER, clock=Clock(time.time() - 30))
    save(store, convs["cold"], "cold")
    save(store, random_tokens(40, 5), "shutdown")
    store.close()
    return directory, convs


def test_ls_lists_every_model_with_its_own_totals(two_models, capsys) -> None:
    directory, convs = two_models
    code, out, _ = kv(capsys, "ls", "--kv-cache-dir", str(directory))
    assert code == 0 and "5 checkpoints of 2 models" in out
    rows = [line for line in out.splitlines() if cid(convs["cold"])[:12] in line]
    assert (
        len(rows) == 2
        and any("test-model/bf16" in r for r in rows)
        and any("other-mode/f32" in r for r in rows)
    )
    document = json.loads(kv(capsys, "ls", "--kv-cache-dir", str(directory), "--json")[1])
    models = {m["model_fingerprint"]: m for m in document["models"]}
    assert models[OTHER.fingerprint]["num_checkpoints"] == 2 and models[OTHER.fingerprint]["model_dir"] == (
        model_dir(directory, OTHER).name
    )
    assert document["totals"]["bytes_on_disk"] == files_bytes(directory)
    assert sum(m["bytes_on_disk"] for m in models.values()) == files_bytes(directory)


def test_an_id_shared_by_two_models_needs_model_to_pick_one(two_models, capsys) -> None:
    directory, convs = two_models
    code, _, err = kv(capsys, "show", cid(convs["cold"]), "--kv-cache-dir", str(directory))
    assert code == 1 and "ambiguous" in err and "--model" in err
    code, out, _ = kv(
        capsys, "show", cid(convs["cold"]), "--model", "other", "--kv-cache-dir", str(directory), "--json"
    )
    assert code == 0 and json.loads(out)["model_fingerprint"] == OTHER.fingerprint
    code, out, _ = kv(capsys, "rm", cid(convs["cold"]), "--model", "other", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 1 checkpoints" in out
    store = open_store(directory)
    assert store.get(cid(convs["cold"])) is not None  # the other model's copy is kept
    store.close()
    code, out, _ = kv(capsys, "rm", "--all", "--model", "other", "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 1 checkpoints" in out
    assert not list((model_dir(directory, OTHER) / "checkpoints").iterdir())
    assert len(list((model_dir(directory) / "checkpoints").iterdir())) == 3


def test_prune_by_budget_bounds_the_whole_directory_across_models(two_models, capsys) -> None:
    directory, _ = two_models
    for budget in (files_bytes(directory) - 1, files_bytes(directory) // 3):
        code, out, _ = kv(
            capsys, "prune", "--budget-mb", f"{budget / MIB:.9f}", "--kv-cache-dir", str(directory)
        )
        assert code == 0 and files_bytes(directory) <= budget, out
    assert "removed 1 checkpoints" not in out  # the second cut needed several, of both models
    assert "test-model" in out and "other-mode" in out
    assert kv(capsys, "verify", "--kv-cache-dir", str(directory))[0] == 0


def test_verify_checks_each_model_against_its_own_identity(two_models, capsys) -> None:
    directory, _ = two_models
    code, out, _ = kv(capsys, "verify", "--kv-cache-dir", str(directory))
    assert code == 0 and "2 models" in out and "other-model:float32:none" in out and "test-model" in out


def flatten(directory: Path, identity=None) -> None:
    """Turn a model subdirectory back into the old single-model layout (files in the root)."""
    own = model_dir(directory, identity)
    for sub in ("checkpoints", "chunks"):
        (own / sub).rename(directory / sub)
    (own / "index.sqlite").rename(directory / "index.sqlite")
    for path in own.iterdir():
        path.unlink()
    own.rmdir()


def test_an_old_flat_layout_is_listed_and_moved_into_its_model_subdirectory(cache, capsys) -> None:
    directory, convs = cache
    flatten(directory)
    (directory / "chunks" / f"{'e' * 32}.kvc").write_bytes(b"orphan")
    code, out, _ = kv(capsys, "ls", "--kv-cache-dir", str(directory))
    assert code == 0 and "3 checkpoints of 1 models" in out and "old flat layout" in out
    assert kv(capsys, "verify", "--kv-cache-dir", str(directory))[0] == 1  # the orphan
    store = open_store(directory)  # a server start moves it (nobody else holds the directory)
    assert {c.checkpoint_id for c in store.checkpoints()} == set(map(cid, convs.values()))
    assert store.load(cid(convs["continued"])) is not None and store.verify() == 0
    store.close()
    assert not (directory / "checkpoints").exists() and not (directory / "chunks").exists()
    assert not (directory / "index.sqlite").exists()
    assert kv(capsys, "verify", "--kv-cache-dir", str(directory))[0] == 0


def test_a_flat_layout_stays_while_a_server_holds_the_directory_and_edits_move_it(cache, capsys) -> None:
    directory, convs = cache
    flatten(directory)
    server = DirLock(directory, exclusive=False)  # another server holds the directory
    busy = open_store(directory)  # so this one cannot migrate: it starts empty and deletes nothing
    assert busy.stats().num_checkpoints == 0 and len(list((directory / "checkpoints").iterdir())) == 3
    busy.close()
    server.release()
    code, out, _ = kv(capsys, "rm", cid(convs["cold"])[:10], "--kv-cache-dir", str(directory))
    assert code == 0 and "removed 1 checkpoints" in out and not (directory / "checkpoints").exists()
    assert {c.checkpoint_id for c in open_store(directory).checkpoints()} == {
        cid(convs["continued"]),
        cid(convs["evict"]),
    }
