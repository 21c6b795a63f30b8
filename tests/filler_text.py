"""Prompts of plain filler words for real-model server tests: long, cheap to make, reproducible from
a seed, and sized in words (the word set decides how many tokens a word costs)."""

from __future__ import annotations

import random

WORDS = (
    "river",
    "stone",
    "garden",
    "window",
    "market",
    "lantern",
    "engine",
    "harbor",
    "forest",
    "signal",
    "paper",
    "orbit",
    "copper",
    "winter",
    "meadow",
    "bridge",
    "candle",
    "rocket",
    "thunder",
    "velvet",
    "pencil",
    "castle",
    "marble",
    "planet",
    "silver",
    "ladder",
    "island",
    "ribbon",
    "compass",
    "violin",
    "desert",
    "canyon",
    "glacier",
    "falcon",
    "mirror",
)


def filler(rng: random.Random, num_words: int, words: tuple[str, ...] = WORDS) -> str:
    """`num_words` words drawn from `words`, ending in a full stop."""
    return " ".join(rng.choice(words) for _ in range(num_words)) + "."
