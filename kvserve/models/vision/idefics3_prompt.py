"""Idefics3 / SmolVLM prompt expansion: each `<image>` placeholder the chat template wrote becomes
the image's tile markers and `image_seq_len` image tokens per tile, as transformers'
`Idefics3Processor` writes them. The tile grid comes from `idefics3_processor.process_image`."""

from __future__ import annotations

from collections.abc import Sequence

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"


class ImagePlaceholderError(ValueError):
    """The rendered prompt's `<image>` placeholders and the images differ in number."""


def image_prompt(rows: int, cols: int, image_seq_len: int) -> str:
    """One image's text: for a split image, a line per tile row (each tile as
    `<fake_token_around_image><row_R_col_C>` and its image tokens), then a blank line; always the
    global image last, wrapped in `<fake_token_around_image>`."""
    image_tokens = IMAGE_TOKEN * image_seq_len
    tile_rows = (
        "".join(f"{FAKE_IMAGE_TOKEN}<row_{r}_col_{c}>{image_tokens}" for c in range(1, cols + 1)) + "\n"
        for r in range(1, rows + 1)
    )
    blank_line = "\n" if rows else ""
    global_image = f"{FAKE_IMAGE_TOKEN}{GLOBAL_IMAGE_TOKEN}{image_tokens}{FAKE_IMAGE_TOKEN}"
    return "".join(tile_rows) + blank_line + global_image


def num_image_tokens(rows: int, cols: int, image_seq_len: int) -> int:
    """How many `<image>` tokens `image_prompt` writes: one tile's worth per tile and the global
    image, which is the number of rows the encoder returns for the image's tiles."""
    return (rows * cols + 1) * image_seq_len


def expand_image_placeholders(text: str, grids: Sequence[tuple[int, int]], image_seq_len: int) -> str:
    """`text` with its i-th `<image>` replaced by `image_prompt(*grids[i], image_seq_len)`.

    NOTE: an `<image>` a client typed as text counts too, as in transformers: the count no longer
    matches and this raises, rather than giving one image's tokens to another's place."""
    pieces = text.split(IMAGE_TOKEN)
    if len(pieces) - 1 != len(grids):
        raise ImagePlaceholderError(
            f"{len(pieces) - 1} {IMAGE_TOKEN} placeholders in the prompt but {len(grids)} images"
        )
    expanded = [pieces[0]]
    for (rows, cols), piece in zip(grids, pieces[1:], strict=True):
        expanded += [image_prompt(rows, cols, image_seq_len), piece]
    return "".join(expanded)
