"""Which token constraint a request decodes under, compiled against the model's tokenizer.

- `tool_choice` "required" or a named tool: a grammar that forces exactly one call (to any tool, or
  to the named one) in the model's own tool-call syntax, arguments valid against the
  tool's JSON schema (`grammar/tool_grammar.py`).
- `response_format` json_object / json_schema: a grammar of JSON (valid against the schema).
- `tool_choice` "auto" with tools: no mask; the structure tracker makes the markup bytes of a call
  greedy while argument values keep the request's temperature (`grammar/structure.py`).
A forced tool call wins over `response_format` (the call is the answer). A model with reasoning markup
may think first (must close the block first when the prompt opened it). Compiled grammars are cached
by their text, which is a function of (schema, syntax).
"""

from __future__ import annotations

import logging

from kvserve.chat.conversation import ChatRequest, JsonFormat, NamedToolChoice, TextRequest, ToolSpec
from kvserve.grammar.compiler import GrammarCompiler, GrammarError
from kvserve.grammar.constraint import ConstraintRecipe, GrammarConstraint
from kvserve.grammar.json_format import json_grammar
from kvserve.grammar.lark import with_reasoning
from kvserve.grammar.structure import StructureTracker, structure_tracker
from kvserve.grammar.tool_grammar import tool_call_grammar
from kvserve.reasoning import ReasoningSyntax, prompt_opens_reasoning
from kvserve.serving.engine_protocol import TokenConstraint
from kvserve.serving.errors import RequestError

logger = logging.getLogger(__name__)


class DecodingConstraints:
    def __init__(
        self,
        compiler: GrammarCompiler,
        tool_syntax: str,
        reasoning: ReasoningSyntax | None = None,
        structural_greedy: bool = True,
    ):
        """`reasoning` (the model's reasoning markup) lets a thinking model think before a forced output;
        `structural_greedy` samples the markup of "auto" calls greedily."""
        self.compiler = compiler
        self.tool_syntax = tool_syntax
        self.reasoning = reasoning
        self.structural_greedy = structural_greedy

    def for_chat(self, request: ChatRequest, prompt: str = "") -> TokenConstraint | None:
        """`prompt`: the rendered prompt, which says whether the output starts inside reasoning."""
        tools = _forced_tools(request)
        if tools:
            # One call: small models asked for "one or more" tend to repeat the call until max_tokens.
            lark = self._after_reasoning(
                tool_call_grammar(self.tool_syntax, tools, parallel=False), request, prompt
            )
            return self._compile(lark, "tools", tracker=self._tracker())
        if request.response_format is not None:
            lark = self._after_reasoning(json_grammar(request.response_format.schema), request, prompt)
            return self._compile(lark, "response_format")
        if request.active_tools and request.options.sampling.temperature != 0:
            tracker = self._tracker()  # a greedy request is greedy everywhere already
            if tracker is None:
                return None
            constraint = GrammarConstraint(None, tracker)
            constraint.recipe = ConstraintRecipe(None, self.tool_syntax)
            return constraint
        return None

    def for_text(self, request: TextRequest) -> TokenConstraint | None:
        return None if request.response_format is None else self.for_format(request.response_format)

    def for_format(self, response_format: JsonFormat) -> TokenConstraint:
        return self._compile(json_grammar(response_format.schema), "response_format")

    def _compile(self, lark: str, param: str, tracker: StructureTracker | None = None) -> TokenConstraint:
        try:
            constraint = self.compiler.constraint(lark, tracker)
        except GrammarError as error:
            what = "JSON schema" if param == "response_format" else "tool parameter schema"
            raise RequestError(f"{param}: invalid {what}: {error}", param=param) from error
        constraint.recipe = ConstraintRecipe(lark, None if tracker is None else self.tool_syntax)
        return constraint

    def _after_reasoning(self, lark: str, request: ChatRequest, prompt: str) -> str:
        syntax = self.reasoning
        if syntax is None:
            return lark
        if prompt_opens_reasoning(prompt, syntax):
            return with_reasoning(lark, syntax.open, syntax.close, is_open=True)
        if request.reasoning.enabled is False:
            return lark
        return with_reasoning(lark, syntax.open, syntax.close, is_open=False)

    def _tracker(self) -> StructureTracker | None:
        if not self.structural_greedy:
            return None
        try:
            tokenizer = self.compiler.tokenizer  # built here, never on the engine thread
        except GrammarError as error:
            logger.warning("structural greedy sampling is off: %s", error)
            self.structural_greedy = False
            return None
        return structure_tracker(self.tool_syntax, lambda token_id: tokenizer.decode_bytes([token_id]))


def _forced_tools(request: ChatRequest) -> tuple[ToolSpec, ...]:
    """The tools a call is forced among: all of them ("required"), the named one, or none (free)."""
    choice = request.tool_choice
    if choice == "required":
        if not request.tools:
            raise RequestError('tool_choice "required" needs at least one tool', param="tool_choice")
        return request.tools
    if isinstance(choice, NamedToolChoice):
        named = tuple(t for t in request.tools if t.name == choice.name)
        if not named:
            raise RequestError(f"tool_choice names the unknown tool {choice.name!r}", param="tool_choice")
        return named
    return ()
