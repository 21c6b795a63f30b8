"""Llama family (Llama 2/3.x, SmolLM2, TinyLlama, Mistral): the shared blocks as they are.

Deltas handled by the config alone: `attention_bias` (q/k/v/o bias), llama3 or linear
`rope_scaling`, tied embeddings (SmolLM2), and Mistral's window (every layer sliding).
"""

from __future__ import annotations

from kvserve.models.common import CausalLMBase


class LlamaForCausalLM(CausalLMBase):
    pass
