"""DRY ("Don't Repeat Yourself"), the anti-loop sampler of llama.cpp and koboldcpp.

A repetition penalty looks at single tokens in a window, so a loop whose period is longer than the
window (SmolLM2-135M repeating a 55-token paragraph under a 64-token window) never sees it. DRY
looks at sequences: when the last `n` tokens already occurred earlier followed by token `c`,
sampling `c` would extend a verbatim repeat of length `n + 1`, and `c` loses
`multiplier * base ** (n - allowed_length)` logits once `n >= allowed_length`. Matches do not
extend across sequence breakers (tokens holding a newline, ':', '"' or '*', llama.cpp's default
breakers), so repeated formatting (list markers, JSON keys, indentation) is not penalized.

One departure from llama.cpp: the history is the answer only, not the prompt. llama.cpp's default
window is the whole context, which also penalizes an answer for quoting its prompt; coding agents'
answers quote their context all the time (file contents in an edit), and the loops that keep a
small model from ending its turn are repeats within its own answer.

Pure numpy on the host, once per penalized row and step: the answer so far is scanned for
occurrences of its last token, and those are extended backwards together (vectorized), so a step
costs O(answer length) with a small constant.
"""

from __future__ import annotations

import numpy as np

SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
# llama.cpp caps the exponent so that base ** exponent stays finite in float32.
_MAX_MATCH = 50


def breaker_mask(token_texts: list[str]) -> np.ndarray:
    """[V] bool: the tokens whose text holds a sequence breaker."""
    return np.array([any(b in text for b in SEQUENCE_BREAKERS) for text in token_texts], dtype=bool)


def dry_penalties(
    history: list[int], breakers: np.ndarray, multiplier: float, base: float, allowed_length: int
) -> dict[int, float]:
    """{token id: logits to subtract} for the next token after `history` (the answer so far)."""
    n = len(history)
    if multiplier <= 0 or n < 2:
        return {}
    tokens = np.asarray(history, dtype=np.int64)
    is_breaker = breakers[np.clip(tokens, 0, len(breakers) - 1)] & (tokens < len(breakers))
    if is_breaker[-1]:
        return {}
    # Earlier occurrences of the last token; each is a match of length 1 so far.
    starts = np.flatnonzero(tokens[:-1] == tokens[-1])
    lengths = np.ones(len(starts), dtype=np.int64)
    alive = np.ones(len(starts), dtype=bool)
    for k in range(1, min(n - 1, _MAX_MATCH)):
        if not alive.any():
            break
        earlier = starts - k
        tail = n - 1 - k
        ok = alive & (earlier >= 0)
        ok[ok] = (tokens[earlier[ok]] == tokens[tail]) & ~is_breaker[tail]
        lengths += ok
        alive = ok
    penalties: dict[int, float] = {}
    for start, length in zip(starts.tolist(), lengths.tolist()):
        if length < allowed_length:
            continue
        following = int(tokens[start + 1])
        value = multiplier * base ** (length - allowed_length)
        if value > penalties.get(following, 0.0):
            penalties[following] = value
    return penalties
