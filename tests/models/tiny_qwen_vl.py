"""A tiny random-weight Qwen2.5-VL folder, laid out as `kvserve serve --model DIR` loads a real one:
weights (transformers 5.25 saves the Hub's names: `model.`, `visual.`, `lm_head.`), SmolLM2's
tokenizer with Qwen's vision tokens added, Qwen2.5-VL's chat template, and its image-processor
settings scaled down (patches of 4 pixels merged 2 x 2, so an image of 32 x 32 pixels is 4 x 4
tokens, cut into 2 x 2 windows of 2 x 2 tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Qwen2.5-VL-3B/7B-Instruct's chat template (chat_template.json), unchanged.
QWEN25_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH, MERGE, WINDOW = 4, 2, 16  # WINDOW pixels: 2 x 2 merged tokens

# Qwen2.5-VL-3B-Instruct's shapes, for runs at real cost with random weights.
QWEN25_VL_3B: dict[str, Any] = {
    "text": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
             "num_key_value_heads": 2, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}},
    "vision": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": 2048,
               "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
               "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu"},
    "tie_word_embeddings": True, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280,
}  # fmt: skip
TINY: dict[str, Any] = {
    "text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
    "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 4, "out_hidden_size": 64,
               "patch_size": PATCH, "temporal_patch_size": 2, "spatial_merge_size": MERGE, "window_size": WINDOW,
               "fullatt_block_indexes": [1], "hidden_act": "silu"},
    "tie_word_embeddings": False, "min_pixels": 16 * 16, "max_pixels": 32 * 48,
}  # fmt: skip


def hf_config(shapes: dict[str, Any], vocab_size: int, token_ids: dict[str, int] | None = None) -> Any:
    """A transformers `Qwen2_5_VLConfig` of these shapes; `token_ids`: its image, video, vision
    start/end and eos ids (Qwen's without)."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config={**shapes["text"], "vocab_size": vocab_size},
        vision_config=shapes["vision"],
        tie_word_embeddings=shapes["tie_word_embeddings"],
        **(token_ids or {}),
    )


def hf_qwen_processor(image_processor: Any, tokenizer: Any) -> Any:
    """transformers' `Qwen2_5_VLProcessor` as `__init__` would make it without a video processor:
    `__init__` insists on one, and transformers' needs torchvision, which images never use."""
    from transformers import Qwen2_5_VLProcessor

    processor = Qwen2_5_VLProcessor.__new__(Qwen2_5_VLProcessor)
    processor.image_processor, processor.tokenizer, processor.video_processor = (
        image_processor,
        tokenizer,
        None,
    )
    processor.chat_template = None
    processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
    processor.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    processor.video_token_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    return processor


def save_tiny_qwen_vl(
    path: Path, seed: int = 0, shapes: dict[str, Any] | None = None, tokenizer_dir: Path | None = None
) -> Path:
    """Writes the folder at `path` and returns it; `shapes` (TINY's keys, e.g. QWEN25_VL_3B) replaces
    the tiny ones; `tokenizer_dir` as tiny_vlm.save_tiny_vlm's."""
    import torch
    import transformers

    from tests.models.tiny_vlm import smollm2_tokenizer

    tokenizer = smollm2_tokenizer(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = QWEN25_VL_TEMPLATE
    shapes = shapes or TINY
    ids = tokenizer.convert_tokens_to_ids
    token_ids = {
        "image_token_id": ids("<|image_pad|>"), "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>"),
    }  # fmt: skip
    # The decoder's own ids (its config's defaults are Qwen's, outside SmolLM2's vocabulary).
    text_ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": ids("<|im_end|>")}
    config = hf_config({**shapes, "text": {**shapes["text"], **text_ids}}, len(tokenizer), token_ids)
    torch.manual_seed(seed)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    vision = shapes["vision"]
    (path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": "Qwen2_5_VLProcessor",
                "min_pixels": shapes["min_pixels"],
                "max_pixels": shapes["max_pixels"],
                "patch_size": vision["patch_size"],
                "temporal_patch_size": vision["temporal_patch_size"],
                "merge_size": vision["spatial_merge_size"],
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
            },
            indent=1,
        )
    )
    return path
