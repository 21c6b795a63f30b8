"""Lark text -> llguidance matchers over the model's tokenizer, compiled once per grammar (LRU).

The llguidance tokenizer is built on first use (about a second for a 50K vocabulary). A compiled
grammar is kept as a prototype matcher; each request gets a deep copy, which costs far less than a
compile. Safe to call from several threads (requests are prepared off the event loop).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import llguidance

from kvserve.grammar.constraint import ConstraintRecipe, GrammarConstraint, StructureTracker

DEFAULT_MAX_CACHED = 128


class GrammarError(ValueError):
    """The grammar (usually a client's JSON schema inside it) does not compile."""


def tokenizer_factory(
    tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]
) -> Callable[[], llguidance.LLTokenizer]:
    """How to build the llguidance tokenizer of a Hugging Face fast tokenizer, or of any tokenizer that
    lists its tokens' bytes (`tokens`, `eos_token_id`, `bos_token_id`, callable: llguidance's
    TokenizerWrapper protocol). `vocab_size` is the width of the model's logits."""
    eos = list(eos_token_ids)

    def build() -> llguidance.LLTokenizer:
        import transformers

        if isinstance(tokenizer, transformers.PreTrainedTokenizerFast):
            from llguidance.hf import from_tokenizer

            return from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos or None)
        wrapped = llguidance.TokenizerWrapper(tokenizer)
        return llguidance.LLTokenizer(wrapped, n_vocab=vocab_size, eos_token=eos or None)

    return build


class GrammarCompiler:
    def __init__(
        self, make_tokenizer: Callable[[], llguidance.LLTokenizer], max_cached: int = DEFAULT_MAX_CACHED
    ):
        self._make_tokenizer = make_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._max_cached = max_cached
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """Raises GrammarError when the model's tokenizer cannot be wrapped (not a fast tokenizer)."""
        with self._lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = self._make_tokenizer()
                except (ValueError, TypeError, AttributeError) as error:
                    raise GrammarError(
                        f"constrained decoding is unavailable for this tokenizer ({error})"
                    ) from error
            return self._tokenizer

    def constraint(self, lark: str, tracker: StructureTracker | None = None) -> GrammarConstraint:
        """A fresh constraint for one request. Raises GrammarError when `lark` does not compile."""
        matcher = self._prototype(lark).deep_copy()
        return GrammarConstraint(matcher, tracker, vocab_size=self.tokenizer.vocab_size)

    def _prototype(self, lark: str) -> llguidance.LLMatcher:
        tokenizer = self.tokenizer
        with self._lock:
            matcher = self._cache.get(lark)
            if matcher is not None:
                self._cache.move_to_end(lark)
                return matcher
        matcher = _compile(tokenizer, lark)
        with self._lock:
            self._cache[lark] = matcher
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
        return matcher


class RecipeBuilder:
    """Constraints from their recipes, against a model's tokenizer: the engine process's side of a
    constraint the API front end prepared (and validated) with its own compiler."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.compiler = GrammarCompiler(tokenizer_factory(tokenizer, vocab_size, eos_token_ids))

    def build(self, recipe: ConstraintRecipe) -> GrammarConstraint:
        from kvserve.grammar.structure import structure_tracker

        tracker = None
        if recipe.tracker_syntax is not None:
            llg = self.compiler.tokenizer
            tracker = structure_tracker(recipe.tracker_syntax, lambda token_id: llg.decode_bytes([token_id]))
        if recipe.lark is None:
            constraint = GrammarConstraint(None, tracker)
        else:
            constraint = self.compiler.constraint(recipe.lark, tracker)
        constraint.recipe = recipe
        return constraint


def _compile(tokenizer: llguidance.LLTokenizer, lark: str) -> llguidance.LLMatcher:
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise GrammarError(_first_line(messages[0]))
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(_first_line(matcher.get_error()))
    return matcher


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "invalid grammar"
