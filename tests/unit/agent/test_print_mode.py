"""`kvserve agent -p` and `--json` against a scripted model behind the real kvserve app."""

from __future__ import annotations

import json

import pytest

from kvserve.cli.main import main
from tests.unit.agent.scripted_server import scripted_server, tool_call


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code


def _argv(url: str, tmp_path, *extra: str) -> list[str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return ["agent", "--url", url, "--cwd", str(work), "--data-dir", str(tmp_path / "data"), *extra]


def test_print_mode_runs_the_task_and_prints_the_answer(tmp_path, capsys) -> None:
    replies = [tool_call("write", path="hello.txt", content="hi\n"), "Wrote hello.txt."]
    with scripted_server(replies) as server:
        code = _run(_argv(server.url, tmp_path, "-p", "write hello.txt", "--yes"))
    out, err = capsys.readouterr()
    assert code == 0 and out == "Wrote hello.txt.\n"
    assert "→ write" in err and "✓ created hello.txt" in err
    assert (tmp_path / "work" / "hello.txt").read_text() == "hi\n"
    sessions = list((tmp_path / "data" / "agent" / "sessions").glob("*.json"))
    assert len(sessions) == 1


@pytest.fixture
def no_stdin(monkeypatch):
    """Nobody to answer a confirmation: end of input, which denies."""
    with open("/dev/null") as null:
        monkeypatch.setattr("sys.stdin", null)
        yield


def test_json_transcript_and_denied_tools(tmp_path, capsys, no_stdin) -> None:
    replies = [tool_call("bash", command="touch made"), "It was denied."]
    with scripted_server(replies) as server:
        code = _run(_argv(server.url, tmp_path, "-p", "touch made", "--json", "--session", "s1"))
    out, err = capsys.readouterr()
    transcript = json.loads(out)
    assert code == 0 and transcript["status"] == "done" and transcript["result"] == "It was denied."
    assert transcript["error"] is None
    assert transcript["session"] == "s1" and transcript["usage"]["prompt_tokens"] > 0
    assert [m["role"] for m in transcript["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert "denied" in transcript["messages"][3]["content"]
    assert not (tmp_path / "work" / "made").exists()
    assert err.startswith("allow bash touch made? [y/N]")


def test_allow_list_runs_only_the_listed_tools(tmp_path, capsys, no_stdin) -> None:
    replies = [tool_call("bash", command="touch ok") + tool_call("write", path="no.txt", content="x"), "done"]
    with scripted_server(replies) as server:
        code = _run(_argv(server.url, tmp_path, "-p", "go", "--allow", "bash,read"))
    assert code == 0
    assert (tmp_path / "work" / "ok").exists() and not (tmp_path / "work" / "no.txt").exists()


def test_resume_a_session_by_name_and_the_last_one(tmp_path, capsys) -> None:
    with scripted_server(["first answer", "second answer", "third answer"]) as server:
        assert _run(_argv(server.url, tmp_path, "-p", "one", "--session", "named")) == 0
        assert _run(_argv(server.url, tmp_path, "-p", "two", "--session", "named", "--json")) == 0
        transcript = json.loads(capsys.readouterr().out.split("\n", 1)[1])
        assert [m["content"] for m in transcript["messages"][1:]] == [
            "one",
            "first answer",
            "two",
            "second answer",
        ]
        # the resumed prompt was served from the prefix cache up to the previous turn
        assert transcript["usage"]["cached_tokens"] >= transcript["usage"]["prompt_tokens"] - 64
        assert _run(_argv(server.url, tmp_path, "-p", "three", "-c", "--json")) == 0
        transcript = json.loads(capsys.readouterr().out)
        assert transcript["session"] == "named" and len(transcript["messages"]) == 7


def test_errors_exit_non_zero(tmp_path, capsys) -> None:
    with scripted_server(["x"]) as server:
        assert _run(_argv(server.url, tmp_path, "-p", "hi", "--temperature", "-3")) == 1
        assert "model error: HTTP 400" in capsys.readouterr().err
        assert _run(_argv(server.url, tmp_path, "-p", "hi", "--temperature", "-3", "--json")) == 1
        transcript = json.loads(capsys.readouterr().out)
        assert transcript["status"] == "error" and "HTTP 400" in transcript["error"]
        with pytest.raises(SystemExit, match="no saved session"):
            main(_argv(server.url, tmp_path / "work", "-p", "hi", "-c"))
