"""The agent's tool set: builds every tool over one shared context and runs a model's tool call
through confirmation and the handler, turning every refusal or failure into text for the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.agent.confirm import Confirmer, ConfirmPolicy
from kvserve.agent.messages import ToolCall
from kvserve.agent.tools.base import Args, ImageResult, Tool, ToolContext
from kvserve.agent.tools.bash import Shell, bash_tools
from kvserve.agent.tools.editing import FileEditor, editing_tools
from kvserve.agent.tools.files import FileReader, file_tools
from kvserve.agent.tools.jobs import JobTable
from kvserve.agent.tools.ledger import FileLedger
from kvserve.agent.tools.search import Searcher, search_tools
from kvserve.agent.workspace import ToolError


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    is_error: bool = False
    was_denied: bool = False
    image: str | None = None  # a data: URI shown to the model with the text (view_image)


class Toolbox:
    def __init__(self, ctx: ToolContext, policy: ConfirmPolicy, confirmer: Confirmer, extra: list[Tool] = ()):
        self.ctx = ctx
        self.policy = policy
        self.confirmer = confirmer
        ledger = FileLedger()
        self.jobs = JobTable(ctx.workspace.root)
        tools = [
            *file_tools(FileReader(ctx, ledger)),
            *editing_tools(FileEditor(ctx, ledger)),
            *search_tools(Searcher(ctx)),
            *bash_tools(Shell(ctx, self.jobs)),
            *extra,
        ]
        self.tools = {tool.name: tool for tool in tools}

    def wire_specs(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, description, JSON schema) of every tool, in a stable order (the prompt prefix)."""
        return [(t.name, t.description, t.parameters) for t in self.tools.values()]

    def execute(self, call: ToolCall) -> ToolOutcome:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolOutcome(
                f"error: unknown tool {call.name!r}; the tools are {', '.join(self.tools)}", True
            )
        try:
            values = call.parsed_arguments()
        except ValueError as error:
            return ToolOutcome(f"error: {call.name}: {error}", True)
        needs_asking = tool.needs_confirmation and not self.policy.is_preapproved(tool.name)
        if needs_asking and not self.confirmer(f"allow {tool.summarize(values)}?"):
            return ToolOutcome("the user denied this tool call; do not retry it unchanged", True, True)
        try:
            result = tool.handler(Args(tool.name, values))
        except ToolError as error:
            return ToolOutcome(f"error: {error}", True)
        except OSError as error:  # permissions, disk full, ...: the model can adapt
            return ToolOutcome(f"error: {call.name}: {error.strerror or error}", True)
        if isinstance(result, ImageResult):
            return ToolOutcome(result.text, image=result.data_uri)
        return ToolOutcome(result)

    def close(self) -> None:
        self.jobs.close()
