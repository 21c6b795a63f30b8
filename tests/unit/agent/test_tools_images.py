"""view_image: the result carries the image (media type from the bytes) beside a text line; files
the server would refuse, paths outside the workspace and oversized files are tool errors; the tool
is offered only when the server reports a vision model, and its result reaches the model as an image
in either API."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kvserve.agent.client import ModelClient
from kvserve.agent.tools.images import MAX_IMAGE_BYTES
from kvserve.cli.main import main
from tests.image_samples import encoded, picture, png
from tests.unit.agent.conftest import Box
from tests.unit.agent.scripted_server import scripted_server, tool_call


@pytest.fixture
def vbox(tmp_path: Path):
    b = Box(tmp_path / "work", with_images=True)
    b.root.mkdir()
    yield b
    b.toolbox.close()


def test_a_png_comes_back_as_text_and_image(vbox: Box) -> None:
    (vbox.root / "shots").mkdir()
    (vbox.root / "shots" / "a.png").write_bytes(png(32, 24))
    outcome = vbox("view_image", path="shots/a.png")
    assert not outcome.is_error and outcome.text == "shots/a.png: image/png, 32x24 pixels"
    header, _, data = outcome.image.partition(",")
    assert header == "data:image/png;base64" and base64.b64decode(data) == png(32, 24)


def test_the_media_type_comes_from_the_bytes_not_the_name(vbox: Box) -> None:
    (vbox.root / "photo.png").write_bytes(encoded(picture(8, 4), "JPEG"))
    outcome = vbox("view_image", path="photo.png")
    assert outcome.text == "photo.png: image/jpeg, 8x4 pixels"
    assert outcome.image.startswith("data:image/jpeg;base64,")


def test_non_images_outside_paths_and_large_files_are_refused(vbox: Box, tmp_path: Path) -> None:
    (vbox.root / "notes.txt").write_text("not a picture\n")
    assert "notes.txt: not a PNG, JPEG, WebP or GIF image" in vbox.error("view_image", path="notes.txt")
    (vbox.root / "cut.png").write_bytes(png()[:60])
    assert "could not be decoded" in vbox.error("view_image", path="cut.png")
    (tmp_path / "outside.png").write_bytes(png())
    assert "outside the working directory" in vbox.error("view_image", path="../outside.png")
    with open(vbox.root / "huge.png", "wb") as f:
        f.write(png())
        f.truncate(MAX_IMAGE_BYTES + 1)  # sparse: no 20 MB written
    assert "images over 20 MB are refused" in vbox.error("view_image", path="huge.png")
    assert "no such file" in vbox.error("view_image", path="missing.png")
    assert vbox("view_image", path="notes.txt").image is None


def test_offered_only_when_the_server_reports_vision(tmp_path: Path) -> None:
    with scripted_server([], supports_images=True) as server:
        assert ModelClient(server.url).server_info().supports_images
    with scripted_server([]) as server:
        assert not ModelClient(server.url).server_info().supports_images


def _run_agent(url: str, tmp_path: Path, *extra: str) -> None:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "shot.png").write_bytes(png())
    argv = ["agent", "--url", url, "--cwd", str(work), "--data-dir", str(tmp_path / "data"), *extra]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "-p", "look at shot.png", "--json"])
    assert exit_info.value.code == 0


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_image_reaches_a_vision_model_in_either_api(tmp_path: Path, capsys, api: str) -> None:
    replies = [tool_call("view_image", path="shot.png"), "A gradient."]
    with scripted_server(replies, ctx=32768, supports_images=True) as server:
        _run_agent(server.url, tmp_path, "--api", api)
    tool = json.loads(capsys.readouterr().out)["messages"][3]
    assert tool["content"] == "shot.png: image/png, 32x24 pixels" and tool["image"].startswith(
        "data:image/png"
    )
    assert "shot.png: image/png, 32x24 pixels" in server.script.prompts[-1]
    assert server.script.prompts[-1].count("<image>") == 1


def test_a_text_model_gets_no_view_image(tmp_path: Path, capsys) -> None:
    with scripted_server([tool_call("view_image", path="shot.png"), "ok"]) as server:
        _run_agent(server.url, tmp_path)
    tool = json.loads(capsys.readouterr().out)["messages"][3]
    assert "unknown tool 'view_image'" in tool["content"] and tool["image"] is None
