"""What loading a model yields: the module, its architecture, tokenizer and fingerprint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvserve.models.config import ModelArchConfig

if TYPE_CHECKING:  # annotations only: tokenizer-only callers (benchmark clients) never import torch
    import torch

    from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig
    from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig


class CausalLM(Protocol):
    """The contract every family module (an nn.Module) satisfies for the runner.

    `forward` runs the flat batch described by the current AttentionMetadata
    (see layers/attention/metadata.py); KV for the new tokens is written into the
    bound caches at `slot_mapping` before attention reads it.
    """

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [num_tokens] int64 -> hidden states [num_tokens, hidden_size]."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden_size] -> float32 logits [n, vocab_size] (final norm already applied in forward)."""
        ...

    # Optional: `compute_logits_and_greedy(hidden) -> (logits, argmax) | None`, one fused kernel for
    # both where the model has one (models/common.py); engine/sampler.py: logits_and_greedy.
    # CausalLMBase's forward also takes `inputs_embeds` [num_tokens, hidden_size] in place of the ids'
    # embeddings, which vision families build with their `embed_inputs` (models/idefics3.py).

    def kv_cache_spec(self) -> tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim): one cache per layer, same shape for all."""
        ...

    def bind_kv_caches(self, caches: list[torch.Tensor]) -> None:
        """One tensor per layer, [2, num_blocks, block_size, num_kv_heads, head_dim] (K then V); the
        kernels that depend on them are bound here too (CausalLMBase.select_kernels)."""
        ...


@dataclass(frozen=True)
class TokenizerInfo:
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # EOS plus end-of-turn tokens (e.g. <|im_end|>, <end_of_turn>)
    add_bos_token: bool  # prepend BOS when encoding a raw prompt


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # torch.nn.Module satisfying CausalLM
    arch: ModelArchConfig
    tokenizer: TokenizerInfo
    fingerprint: str  # hex digest of architecture, shapes, dtype and tensor data
    path: Path
    dtype: torch.dtype
    max_model_len: int  # the context it was loaded for: --ctx, else the model's own (see rope_scaling.py)
    # The low-bit decode copy ("int4"/"int8") that holds the file's layer weights at their own
    # precision (a quantized GGUF), None for 16/32-bit weights; --weight-quant auto uses it.
    file_weight_quant: str | None = None
    # The image processor the model file brings (an mmproj's clip.vision.* keys); None: the model
    # folder's preprocessor files say (image_prompt.py).
    image_processor: Idefics3ProcessorConfig | Qwen2VLProcessorConfig | None = None
