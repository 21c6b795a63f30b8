from __future__ import annotations

import pytest

from kvserve.grammar.compiler import GrammarCompiler
from tests.unit.grammar.grammar_helpers import byte_compiler


@pytest.fixture(scope="session")
def compiler() -> GrammarCompiler:
    return byte_compiler()
