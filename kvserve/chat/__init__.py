"""Pure-Python chat layer: rendering, detokenization, stop handling (no torch, no engine)."""
