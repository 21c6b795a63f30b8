"""Grammars for constrained decoding: Lark text per output syntax (pure), compiled by llguidance."""
