"""Chain hashes of KV blocks: text-only hashes stay what they were (the disk tier's chunks are keyed
by them), and an image enters exactly the blocks its span touches, the same in every process."""

from __future__ import annotations

import torch

from kvserve.engine.image_input import ImageInput
from kvserve.engine.kv_cache.block_hash import compute_block_hashes

KEY = "fp:float32:none"
TOKENS = list(range(40))
# Computed before images existed (kvserve beed380): a changed value orphans every stored chunk.
TEXT_HASHES = [0xF9F73D99AF602B587847A6137CD2F3D8, 0xCC26DA84FE2A1E38EBF0EA1CA52CB312]


def _image(content_hash: str = "0123456789abcdef0123456789abcdef", offset: int = 20, num_tokens: int = 4):
    return ImageInput(content_hash, offset, num_tokens, torch.zeros(1))


def test_text_only_hashes_are_unchanged() -> None:
    assert compute_block_hashes(TOKENS, 16, KEY) == TEXT_HASHES
    assert compute_block_hashes(TOKENS, 16, KEY.encode()) == TEXT_HASHES


def test_image_hashes_are_fixed_values() -> None:
    """Literal values: the same bytes on every machine and in every process (no Python hash())."""
    assert compute_block_hashes(TOKENS, 16, KEY, images=[_image()]) == [
        TEXT_HASHES[0],  # [0, 16): before the image
        0x5DEF045C0C602BD656C57CF7BA232B71,
    ]


def test_an_image_enters_the_blocks_its_span_touches_and_the_chain_after() -> None:
    tokens = list(range(64))
    plain = compute_block_hashes(tokens, 8, KEY)
    with_image = compute_block_hashes(tokens, 8, KEY, images=[_image(offset=20, num_tokens=12)])  # [20, 32)
    assert with_image[:2] == plain[:2]
    assert all(a != b for a, b in zip(with_image[2:], plain[2:], strict=True))
    # Blocks 2 and 3 hold the image; the ones after differ only through the chain.
    other = compute_block_hashes(tokens, 8, KEY, images=[_image("another", offset=20, num_tokens=12)])
    assert other[:2] == plain[:2] and len(set(other[2:]) & set(with_image[2:])) == 0


def test_the_same_tokens_with_the_image_elsewhere_hash_apart() -> None:
    """Two adjacent images over the same placeholder tokens, split at another token."""
    tokens = [7] * 16
    a = compute_block_hashes(tokens, 16, KEY, images=[_image("a", 0, 8), _image("b", 8, 8)])
    b = compute_block_hashes(tokens, 16, KEY, images=[_image("a", 0, 6), _image("b", 6, 10)])
    assert a != b


def test_incremental_hashing_with_images_equals_hashing_at_once() -> None:
    tokens = list(range(64))
    images = [_image(offset=10, num_tokens=20)]
    head = compute_block_hashes(tokens[:24], 8, KEY, images=images)
    assert compute_block_hashes(tokens, 8, KEY, head, images) == compute_block_hashes(
        tokens, 8, KEY, images=images
    )
