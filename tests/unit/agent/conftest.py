from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.agent.confirm import ConfirmPolicy
from kvserve.agent.messages import ToolCall
from kvserve.agent.toolbox import Toolbox, ToolOutcome
from kvserve.agent.tools.base import ToolContext
from kvserve.agent.tools.images import image_tools
from kvserve.agent.workspace import Workspace


class Box:
    """A Toolbox over a temp dir that records the confirmation questions it was asked."""

    def __init__(
        self, root: Path, answer: bool = True, allowed: tuple[str, ...] = (), with_images: bool = False
    ):
        self.root = root
        self.questions: list[str] = []
        self.answer = answer
        ctx = ToolContext(Workspace.create(root, allowed))
        self.toolbox = Toolbox(ctx, ConfirmPolicy(), self._confirm, image_tools(ctx) if with_images else [])
        self.ctx = ctx

    def _confirm(self, question: str) -> bool:
        self.questions.append(question)
        return self.answer

    def __call__(self, name: str, **args) -> ToolOutcome:
        return self.toolbox.execute(ToolCall("call_1", name, json.dumps(args)))

    def ok(self, name: str, **args) -> str:
        outcome = self(name, **args)
        assert not outcome.is_error, outcome.text
        return outcome.text

    def error(self, name: str, **args) -> str:
        outcome = self(name, **args)
        assert outcome.is_error, outcome.text
        return outcome.text


@pytest.fixture
def box(tmp_path: Path):
    b = Box(tmp_path / "work")
    b.root.mkdir()
    yield b
    b.toolbox.close()
