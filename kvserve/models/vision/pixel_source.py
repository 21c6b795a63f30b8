"""`PixelSource`: an image's encoder input, made only when it is needed (the engine's `ImageInput`
holds one; each family's prompt layout makes one). Here, in `models`, so that the layouts name it
without importing the engine; torch-free at import, as the API process needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class PixelSource(Protocol):
    """An image's encoder input, float32 on the CPU: Idefics3's tiles [num_tiles, channels, side,
    side], Qwen2.5-VL's patches [num_patches, channels * frames * patch * patch]."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Its shape, known without making it."""
        ...

    def tensor(self) -> torch.Tensor:
        """The values (may decode and resize the image: called on an encoder-cache miss only)."""
        ...
