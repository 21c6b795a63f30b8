"""Named model shapes for the GPU benchmarks: each shape's Hugging Face config, as plain data.

No torch here: `kvserve bench engine --shape` lists these names as its choices when the parser is
built; `shapes.py` builds the random-weight models from them.
"""

from __future__ import annotations

from typing import Any

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0, "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
    "llama-3.1-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
}
