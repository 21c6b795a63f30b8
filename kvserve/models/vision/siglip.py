"""The SigLIP vision encoder as Idefics3 / SmolVLM run it: a patch-embedding conv, learned position
embeddings looked up by bucketed patch coordinates (so a tile smaller than `image_size` still spans
the whole table, as NaViT does), pre-norm encoder layers with bidirectional attention, and a final
LayerNorm.

Attribute names follow HF (`embeddings.patch_embedding`, `encoder.layers.N.mlp.fc1`), except that
q/k/v are fused into `qkv_proj` like the decoder's, which the loader's shard routing fills.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.models.layers.activation import get_activation
from kvserve.models.layers.linear import MergedLinear
from kvserve.models.vision.config import VisionArchConfig


def bucketed_position_ids(
    num_rows: int, num_cols: int, num_per_side: int, device: torch.device
) -> torch.Tensor:
    """Position-table index of each patch of a full `num_rows` x `num_cols` grid, row-major
    [num_rows * num_cols]: each patch's fractional coordinate bucketed into the table's
    `num_per_side` cells per side. The float ops are HF's, so ties fall into the same bucket."""
    boundaries = torch.arange(1 / num_per_side, 1.0, 1 / num_per_side, device=device, dtype=torch.float32)

    def buckets(num: int) -> torch.Tensor:
        step = 1.0 / torch.tensor(num, device=device, dtype=torch.float32)
        coords = torch.arange(num, device=device, dtype=torch.float32) * step
        return torch.bucketize(coords.clamp(max=1.0 - 1e-6), boundaries, right=True)  # [num]

    return (buckets(num_rows)[:, None] * num_per_side + buckets(num_cols)[None, :]).reshape(-1)


class VisionEmbeddings(nn.Module):
    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        self.patch_size, self.num_per_side = config.patch_size, config.num_patches_per_side
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.position_embedding = nn.Embedding(self.num_per_side**2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[num_tiles, channels, height, width] -> [num_tiles, num_patches, hidden]."""
        patches = self.patch_embedding(pixel_values)  # [num_tiles, hidden, rows, cols]
        num_rows, num_cols = patches.shape[-2:]
        position_ids = bucketed_position_ids(num_rows, num_cols, self.num_per_side, pixel_values.device)
        return patches.flatten(2).transpose(1, 2) + self.position_embedding(position_ids)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        dim = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, dim // config.num_attention_heads
        self.qkv_proj = MergedLinear(dim, (dim, dim, dim), bias=True)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_tiles, num_patches, dim = x.shape
        qkv = self.qkv_proj(x).view(num_tiles, num_patches, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [num_tiles, num_heads, num_patches, head_dim]
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch of its tile
        return self.out_proj(out.transpose(1, 2).reshape(num_tiles, num_patches, dim))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    """HF's `encoder`: only the layer list."""

    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(config.num_hidden_layers))


class SiglipVisionModel(nn.Module):
    """HF's `vision_model`: pixels of whole tiles -> one hidden state per patch."""

    def __init__(self, config: VisionArchConfig) -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(config)
        self.encoder = VisionEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[num_tiles, channels, height, width], sides multiples of the patch size and no padding
        (the processor's tiles are whole) -> [num_tiles, num_patches, hidden]."""
        x = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
