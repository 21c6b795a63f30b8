"""Rotary positions that are not the token index: M-RoPE (Qwen2.5-VL).

A family with M-RoPE gives every token three positions (t, h, w). A text token's three are equal;
an image's tokens lie on their (t, h, w) grid, all three offset by where the image starts; the text
after an image goes on from the image's largest spatial extent, not from its token count
(transformers' `Qwen2_5_VLModel.get_rope_index`). So a token's position is a pure function of its
index and the grids of the images before it, which the request carries (`ImageInput.grid`); no
position is stored anywhere, and the KV of a prefix depends on nothing its chain hash lacks (the
image's content hash fixes its grid).

Text tokens need one position only: with t = h = w, M-RoPE's cos/sin equal plain RoPE's at that
position, so decode steps (and prompt chunks without image tokens) keep their one-dimensional
fast paths, shifted by `shift_after`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvserve.engine.image_input import ImageInput


@dataclass(frozen=True)
class _GridSpan:
    offset: int  # first token of the image
    grid: tuple[int, int, int]  # (t, h, w); the span is t * h * w tokens
    shift: int  # position - index for the text before this image

    @property
    def end(self) -> int:
        t, h, w = self.grid
        return self.offset + t * h * w

    @property
    def shift_after(self) -> int:
        """position - index for the text right after the image: it goes on from the image's start
        plus its larger side, whatever its token count."""
        t, h, w = self.grid
        return self.shift + max(h, w) - t * h * w


@dataclass(frozen=True)
class PositionLayout:
    """Token index -> rotary positions of one request whose images lie on 3D grids."""

    spans: tuple[_GridSpan, ...]

    @staticmethod
    def of(images: Sequence[ImageInput]) -> PositionLayout | None:
        """The layout of a request's images (in prompt order); None when every token's position is
        its index (no image with a grid)."""
        spans: list[_GridSpan] = []
        shift = 0
        for image in images:
            if image.grid is None:
                continue
            t, h, w = image.grid
            if min(t, h, w) <= 0 or t * h * w != image.num_tokens:
                raise ValueError(
                    f"the image at {image.offset} spans {image.num_tokens} tokens, not its grid's "
                    f"{t} x {h} x {w}"
                )
            span = _GridSpan(image.offset, image.grid, shift)
            spans.append(span)
            shift = span.shift_after
        return PositionLayout(tuple(spans)) if spans else None

    @property
    def final_shift(self) -> int:
        """position - index of every token after the last image (all decoded tokens)."""
        return self.spans[-1].shift_after

    def touches_grid(self, start: int, end: int) -> bool:
        """Some token of [start, end) belongs to an image (so needs three positions)."""
        return any(span.offset < end and start < span.end for span in self.spans)

    def shifts(self, start: int, end: int) -> np.ndarray:
        """[end - start] int64: position - index of each text token of [start, end) (an image's
        tokens get their image's `shift`, which is meaningless for them: see `positions3`)."""
        index = np.arange(start, end, dtype=np.int64)
        shift = np.zeros(end - start, dtype=np.int64)
        for span in self.spans:
            shift[index >= span.end] = span.shift_after
        return shift

    def positions3(self, start: int, end: int) -> np.ndarray:
        """[3, end - start] int64: the (t, h, w) positions of tokens [start, end)."""
        index = np.arange(start, end, dtype=np.int64)
        positions = np.broadcast_to(index + self.shifts(start, end), (3, end - start)).copy()
        for span in self.spans:
            lo, hi = max(start, span.offset), min(end, span.end)
            if lo >= hi:
                continue
            t, h, w = span.grid
            ti, hi_, wi = np.unravel_index(np.arange(lo - span.offset, hi - span.offset), (t, h, w))
            base = span.offset + span.shift
            positions[:, lo - start : hi - start] = np.stack((ti, hi_, wi)) + base
        return positions
