"""Qwen2.5-VL's vision tower (HF `Qwen2_5_VisionTransformerPretrainedModel`) as plain torch.

Patches come flattened from the processor (`qwen2_vl_processor.py`), each merge x merge block of
patches consecutive. A linear patch embedding, then blocks of 2D-rotary attention: most attend
within windows of `window_size` pixels, those in `fullatt_block_indexes` over a whole frame; never
across images. The sequence is put in window order (whole merge blocks move) before the blocks and
back after the merger, so the output rows of each image are row-major over its merged (t, h, w)
grid: the order of its placeholder tokens in the prompt.

Attribute names are HF's, so a checkpoint loads 1:1 after `strip_vision_prefix`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.models.layers.activation import get_activation
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.vision.config import Qwen2_5VisionConfig

# HF prefix of the tower -> ours: the Hub's Qwen2.5-VL checkpoints (and transformers 5.25's
# save_pretrained, which writes the old names back) say `visual.`; transformers 5's module tree
# (its state_dict) says `model.visual.`.
VISION_PREFIXES = (("model.visual.", "visual."), ("visual.", "visual."))


def strip_vision_prefix(hf_name: str) -> str | None:
    """`visual.<name>` for a tower tensor of either checkpoint layout; None for any other tensor."""
    for prefix, ours in VISION_PREFIXES:
        if hf_name.startswith(prefix):
            return ours + hf_name[len(prefix) :]
    return None


class Segments(NamedTuple):
    """Attention segments (windows, or whole frames) of a packed sequence, grouped by length so that
    one SDPA call covers every segment of a length: `groups[i]` [num_segments, length] indexes the
    sequence, and `inverse` puts the groups' outputs, concatenated, back in sequence order."""

    groups: list[torch.Tensor]
    inverse: torch.Tensor  # [seq_len]: where each position's output lies in the concatenated groups

    @staticmethod
    def from_lengths(lengths: list[int]) -> Segments:
        starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        lengths_t = torch.tensor(lengths)
        groups = []
        for length in sorted(set(lengths)):
            first = starts[lengths_t == length]  # [num_segments]
            groups.append(first[:, None] + torch.arange(length))  # [num_segments, length]
        order = torch.cat([g.reshape(-1) for g in groups])
        return Segments(groups, torch.argsort(order))

    def to(self, device: torch.device) -> Segments:
        return Segments([g.to(device) for g in self.groups], self.inverse.to(device))


class WindowPlan(NamedTuple):
    """How one call's patches are laid out: the window order of merge blocks, the segments of the
    window and full-attention blocks, and each patch's (row, col) in its frame, in window order."""

    window_index: torch.Tensor  # [num_merge_blocks]: the merge block at each window-order place
    windows: Segments
    frames: Segments
    positions: torch.Tensor  # [num_patches, 2] (row, col), in window order

    def to(self, device: torch.device) -> WindowPlan:
        return WindowPlan(
            self.window_index.to(device),
            self.windows.to(device),
            self.frames.to(device),
            self.positions.to(device),
        )


def plan_windows(grid_thw: list[tuple[int, int, int]], config: Qwen2_5VisionConfig) -> WindowPlan:
    """HF's `get_vision_window_index`, `get_vision_position_ids` and `get_vision_cu_seqlens` for
    patch grids `grid_thw` (each (t, h, w) in patches), on the CPU: index bookkeeping, moved to the
    tower's device in a few copies rather than run there as many tiny kernels."""
    merge, side = config.spatial_merge_size, config.merger_window
    window_index, window_lengths, frame_lengths, positions = [], [], [], []
    num_blocks = 0
    for t, h, w in grid_thw:
        if t < 1 or h < merge or w < merge or h % merge or w % merge:
            raise ValueError(f"a patch grid must be whole {merge} x {merge} blocks, not {(t, h, w)}")
        rows, cols = h // merge, w // merge
        index = torch.arange(t * rows * cols).view(t, rows, cols)
        # Pad to whole windows with -1, cut into windows, then drop the padding.
        pad_h, pad_w = -rows % side, -cols % side
        padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
        windows = padded.view(t, (rows + pad_h) // side, side, (cols + pad_w) // side, side)
        windows = windows.permute(0, 1, 3, 2, 4).reshape(-1, side * side)  # [num_windows, side * side]
        sizes = (windows >= 0).sum(1)
        window_index.append(windows[windows >= 0] + num_blocks)
        window_lengths += [int(n) * merge * merge for n in sizes]
        frame_lengths += [h * w] * t
        positions.append(_patch_positions(t, h, w, merge))
        num_blocks += t * rows * cols
    window_index_t = torch.cat(window_index)
    unit = merge * merge
    positions_t = torch.cat(positions).view(-1, unit, 2)[window_index_t].view(-1, 2)
    return WindowPlan(
        window_index_t,
        Segments.from_lengths(window_lengths),
        Segments.from_lengths(frame_lengths),
        positions_t,
    )


def _patch_positions(t: int, h: int, w: int, merge: int) -> torch.Tensor:
    """(row, col) of each patch of a frame in the processor's order (merge blocks row-major, the
    patches of a block row-major inside it), repeated for `t` frames: [t * h * w, 2]."""
    rows = torch.arange(h)[:, None].expand(h, w)
    cols = torch.arange(w)[None, :].expand(h, w)
    blocks = [
        x.reshape(h // merge, merge, w // merge, merge).transpose(1, 2).reshape(-1) for x in (rows, cols)
    ]
    return torch.stack(blocks, dim=-1).repeat(t, 1)


class PatchEmbed(nn.Module):
    """HF's Conv3d with kernel = stride over one patch, computed as the linear map it is; the
    weight keeps the conv's shape [hidden, channels, frames, patch, patch] so checkpoints load."""

    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Module()
        shape = (
            config.hidden_size,
            config.in_channels,
            config.temporal_patch_size,
            config.patch_size,
            config.patch_size,
        )
        self.proj.weight = nn.Parameter(torch.empty(shape))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[num_patches, patch_dim] -> [num_patches, hidden]."""
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.view(weight.shape[0], -1))


class VisionRotary(nn.Module):
    """2D rotary: the first half of each head's rotated dims turn with the patch's row, the second
    with its column (HF's axial `Qwen2_5_VLVisionRotaryEmbedding`)."""

    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.dim, self.theta = config.head_dim // 2, config.rope_theta
        self.inv_freq = nn.Buffer(self._inv_freq(), persistent=False)

    def _inv_freq(self) -> torch.Tensor:
        return 1.0 / (
            self.theta ** (torch.arange(0, self.dim, 2, dtype=torch.float, device="cpu") / self.dim)
        )

    def reset_parameters(self) -> None:
        """Recompute `inv_freq`: a model built on the meta device and moved with `to_empty` holds
        uninitialized memory there (the loader fills parameters, not buffers)."""
        self.inv_freq = self._inv_freq().to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_patches, 2] (row, col) -> cos, sin [num_patches, head_dim] float32."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # [num_patches, 2, dim / 2]
        angles = freqs.flatten(1)  # rows' then cols' frequencies
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_patches, num_heads, head_dim] rotated in fp32 (HF's `apply_rotary_pos_emb_vision`)."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Segments
    ) -> torch.Tensor:
        num_patches = x.shape[0]
        q, k, v = self.qkv(x).view(num_patches, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        outs = []
        for index in segments.groups:  # [num_segments, length]: every segment of one length at once
            q_s, k_s, v_s = (
                t[index].transpose(1, 2) for t in (q, k, v)
            )  # [num_segments, heads, length, dim]
            out = F.scaled_dot_product_attention(q_s, k_s, v_s)
            outs.append(out.transpose(1, 2).reshape(-1, self.num_heads * self.head_dim))
        return self.proj(torch.cat(outs)[segments.inverse])


class VisionMLP(nn.Module):
    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        dim, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(dim, inner, bias=True)
        self.up_proj = nn.Linear(dim, inner, bias=True)
        self.down_proj = nn.Linear(inner, dim, bias=True)
        self.act = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size, eps=1e-6)
        self.norm2 = RMSNorm(config.hidden_size, eps=1e-6)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], segments: Segments
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rotary, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Each merge x merge block of patches (consecutive rows) -> one decoder-sized row."""

    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = RMSNorm(config.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged_size, self.merged_size),
            nn.GELU(),
            nn.Linear(self.merged_size, config.out_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged_size))


class Qwen2_5VisionTransformer(nn.Module):
    """HF's `visual`: flattened patches of one or more images -> their decoder rows."""

    def __init__(self, config: Qwen2_5VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.rotary_pos_emb = VisionRotary(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixel_values [num_patches, patch_dim] (the processor's rows, images concatenated) and
        grid_thw [num_images, 3] (each image's patch grid) -> [num_patches // merge**2,
        out_hidden_size], each image's rows row-major over its merged grid."""
        grids = [(int(t), int(h), int(w)) for t, h, w in grid_thw.tolist()]
        if sum(t * h * w for t, h, w in grids) != pixel_values.shape[0]:
            raise ValueError(f"{pixel_values.shape[0]} patches for patch grids {grids}")
        plan = plan_windows(grids, self.config).to(pixel_values.device)
        unit = self.config.spatial_merge_size**2
        x = self.patch_embed(pixel_values)  # [num_patches, hidden]
        x = x.view(-1, unit, x.shape[-1])[plan.window_index].view(x.shape)
        rotary = self.rotary_pos_emb(plan.positions)
        full = set(self.config.fullatt_block_indexes)
        for i, block in enumerate(self.blocks):
            x = block(x, rotary, plan.frames if i in full else plan.windows)
        merged = self.merger(x)  # [num_merge_blocks, out_hidden], in window order
        return merged[torch.argsort(plan.window_index)]
