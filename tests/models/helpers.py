"""Test helpers: tiny random HF models and a paged driver that plays the engine runner's role."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from kvserve.models.layers.attention.metadata import AttentionMetadata, forward_context

TINY = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def tiny_hf_config(family: str):  # -> transformers.PretrainedConfig
    import transformers

    if family == "llama":
        rope = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
        return transformers.LlamaConfig(**TINY, head_dim=16, rope_scaling=rope, rope_theta=10_000.0)
    if family == "llama_yarn":  # YaRN past an original context of 16, with DeepSeek-style mscales
        rope = {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 8.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        }
        return transformers.LlamaConfig(**TINY, head_dim=16, rope_scaling=rope, rope_theta=10_000.0)
    if family == "qwen2_linear":
        return transformers.Qwen2Config(**TINY, rope_scaling={"rope_type": "linear", "factor": 3.0})
    if family == "llama_tied":
        return transformers.LlamaConfig(**TINY, tie_word_embeddings=True, rope_theta=100_000.0)
    if family == "qwen2":
        return transformers.Qwen2Config(**TINY, rope_theta=1_000_000.0)
    if family == "qwen3":
        return transformers.Qwen3Config(**TINY, head_dim=32)
    if family in ("gemma3", "gemma3_hd256"):  # hd256: Gemma 3 270M's head size, for the GPU kernels
        return transformers.Gemma3TextConfig(
            **{**TINY, "num_hidden_layers": 4},
            head_dim=256 if family == "gemma3_hd256" else 32,
            sliding_window=8,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        )
    raise ValueError(family)


def make_tiny_hf_model(family: str, seed: int = 0) -> nn.Module:
    """A random-weight HF *ForCausalLM; norms get random weights too so their convention matters."""
    import transformers

    torch.manual_seed(seed)
    config = tiny_hf_config(family)
    config.initializer_range = 0.1
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param) * 0.3 + (0.0 if family.startswith("gemma3") else 1.0))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# The tiny Idefics3: 32-pixel tiles, a 4 x 4 grid of 8-pixel patches pixel-shuffled into 2 x 2 tokens.
IMAGE_TOKEN_ID = 383
TILE = 32
TOKENS_PER_TILE = 4


def tiny_idefics3_config():  # -> transformers.Idefics3Config
    import transformers

    text = transformers.LlamaConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=100_000.0, rms_norm_eps=1e-5,
    )  # fmt: skip
    vision = {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "image_size": TILE, "patch_size": 8, "layer_norm_eps": 1e-6,
    }  # fmt: skip
    return transformers.Idefics3Config(
        text_config=text.to_dict(), vision_config=vision, scale_factor=2, image_token_id=IMAGE_TOKEN_ID
    )


def make_tiny_idefics3(seed: int = 0) -> nn.Module:
    """A random-weight HF Idefics3ForConditionalGeneration; norms and the vision position table get
    random values too, so their conventions matter."""
    import transformers

    torch.manual_seed(seed)
    config = tiny_idefics3_config()
    config.initializer_range = config.text_config.initializer_range = 0.1
    hf = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or "position_embedding" in name:
                param.copy_(torch.randn_like(param) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    return hf


class SavedIdefics3(NamedTuple):
    hf: nn.Module  # transformers' model, the oracle
    path: Path  # its safetensors folder, for kvserve's loader


def save_tiny_idefics3(path: Path) -> SavedIdefics3:
    hf = make_tiny_idefics3()
    hf.save_pretrained(path, safe_serialization=True)
    return SavedIdefics3(hf, path)


def save_tiny_hf_model(family: str, path: Path, seed: int = 0) -> nn.Module:
    model = make_tiny_hf_model(family, seed)
    model.save_pretrained(path, safe_serialization=True)
    return model


@dataclass
class _Seq:
    block_ids: list[int] = field(default_factory=list)
    num_cached: int = 0


class PagedDriver:
    """Runs a CausalLM over a paged cache the way the engine runner does.

    Physical blocks are handed out in a shuffled order, so a sequence's blocks are
    non-contiguous and out of order: any paging bug shows up as a logits mismatch.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        num_blocks: int = 128,
        block_size: int = 4,
        seed: int = 0,
        position_offset: int = 0,
    ) -> None:
        # position_offset: RoPE positions start there while the cache holds only the sequence itself,
        # which is a forward with HF's position_ids = offset + arange (positions past a long context).
        self.model, self.block_size, self.position_offset = model, block_size, position_offset
        num_layers, num_kv_heads, head_dim = model.kv_cache_spec()
        dtype, device = model.model.embed_tokens.weight.dtype, model.model.embed_tokens.weight.device
        self.device = device
        # Filled with a large finite value: a read of a never-written slot that is not masked
        # wrecks the output, while masked reads add exactly 0 (NaN would poison even those).
        self.caches = [
            torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), 1e4, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        model.bind_kv_caches(self.caches)
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.seqs: dict[int, _Seq] = {}

    def step(
        self,
        chunks: list[tuple[int, list[int]]],
        inputs_embeds: torch.Tensor | None = None,
        positions3: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """chunks: (seq_id, new token ids), decodes (one token, non-empty cache) first; inputs_embeds
        [num_tokens, hidden], where given, replaces the ids' embeddings (image rows merged in);
        positions3 [3, num_tokens], where given, are M-RoPE's (t, h, w) positions in place of the
        indexes. Returns float32 logits [num_tokens, vocab] for every new token, in batch order."""
        input_ids, positions, slots, starts = [], [], [], [0]
        seq_lens, context_lens, tables = [], [], []
        num_decodes = 0
        for seq_id, tokens in chunks:
            seq = self.seqs.setdefault(seq_id, _Seq())
            is_decode = len(tokens) == 1 and seq.num_cached > 0
            assert not is_decode or num_decodes == len(seq_lens), "decodes must come first"
            num_decodes += is_decode
            start, end = seq.num_cached, seq.num_cached + len(tokens)
            while len(seq.block_ids) * self.block_size < end:
                seq.block_ids.append(self.free_blocks.pop())
            for pos in range(start, end):
                slots.append(seq.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size)
            input_ids += tokens
            positions += range(start + self.position_offset, end + self.position_offset)
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(end)
            context_lens.append(start)
            tables.append(seq.block_ids)
            seq.num_cached = end
        width = max(len(t) for t in tables)
        device = self.device
        metadata = AttentionMetadata(
            block_size=self.block_size,
            num_decodes=num_decodes,
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device),
            seq_lens=torch.tensor(seq_lens, device=device),
            query_start_loc_cpu=starts,
            seq_lens_cpu=seq_lens,
            context_lens_cpu=context_lens,
        )
        with torch.no_grad(), forward_context(metadata):
            ids, pos = torch.tensor(input_ids, device=device), torch.tensor(positions, device=device)
            if positions3 is not None:
                pos = positions3.to(device)
            hidden = self.model(ids, pos) if inputs_embeds is None else self.model(ids, pos, inputs_embeds)
            return self.model.compute_logits(hidden).cpu()

    def generate(self, seq_id: int, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy: one prefill, then one decode step per token."""
        token = int(self.step([(seq_id, prompt)])[-1].argmax())
        out = [token]
        for _ in range(max_new_tokens - 1):
            token = int(self.step([(seq_id, [token])])[-1].argmax())
            out.append(token)
        return out
