"""An Idefics3 / SmolVLM or Qwen2.5-VL HF folder -> llama.cpp's pair of files, as
`convert_hf_to_gguf.py` (run once without and once with `--mmproj`) writes them: `{name}-F32.gguf`
(the language model) and `mmproj-{name}-F32.gguf` (the vision tower and connector), for
`kvserve serve --model` (which takes the mmproj beside it) or `llama-server -m ... --mmproj ...`.

    python3 scripts/hf_to_gguf_pair.py path/to/SmolVLM-256M-Instruct out/ --outtype f16

f32 and f16 only (llama-quantize makes the rest from an f16 file).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvserve.models.loader.gguf_export import write_gguf_pair


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "folder", type=Path, help="the HF model folder (config.json, *.safetensors, tokenizer)"
    )
    parser.add_argument("out_dir", type=Path, help="where the two files go")
    parser.add_argument(
        "--outtype", choices=["f32", "f16"], default="f32", help="matrices' type (norms stay f32)"
    )
    parser.add_argument(
        "--tokenizer-pre",
        default=None,
        help="llama.cpp's pre-tokenizer name (its converter finds it by hashing); "
        "default: the family's (SmolVLM: smollm, Qwen2.5-VL: qwen2)",
    )
    args = parser.parse_args()
    pair = write_gguf_pair(args.folder, args.out_dir, outtype=args.outtype, tokenizer_pre=args.tokenizer_pre)
    print(f"{pair.language}\n{pair.mmproj}")


if __name__ == "__main__":
    main()
