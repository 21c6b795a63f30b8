"""Tokenizer, chat template and stop ids from a GGUF file or an HF folder → `TokenizerInfo`.

GGUF vocabularies go through transformers' own GGUF conversion (the parity oracle's
tokenizer), which takes seconds to tens of seconds; the converted tokenizer is saved under
the user cache, keyed by the file's path, size and mtime, so later loads take well under a second.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import transformers

from kvserve.models.errors import CorruptModelFileError
from kvserve.models.loaded import TokenizerInfo

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "kvserve" / "tokenizers"
# Tokens that end an assistant turn in the chat formats we know (ChatML, Gemma, Llama 3, SmolVLM's
# Idefics3 format, whose GGUF names it only in its text: llama.cpp's vocabulary finds it by name too).
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_utterance>",
)
# GGUF architectures transformers' GGUF reader has no config for, whose vocabulary is another
# family's: the tokenizer class is named instead of read off a config (what AutoTokenizer picks
# for that family's own files). Qwen2.5-VL's decoder file is `qwen2vl`.
_TOKENIZER_TYPES = {"qwen2vl": "qwen2"}
_GGUF_STOP_ID_KEYS = (
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)


# AutoTokenizer brings in transformers' model-config machinery and, through it, torch (~3-4 s of
# start-up for a benchmark client that needs no model). A folder whose tokenizer is the generic fast
# class (what SmolLM2's GGUF converts to, and what save_pretrained writes for it) loads through that
# class directly: the class AutoTokenizer would pick, without the imports.
_GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _from_pretrained(folder: Path) -> Any:
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    if declared in _GENERIC_TOKENIZER_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_gguf_tokenizer(
    path: Path, metadata: dict[str, Any], *, cache_dir: Path | None = None
) -> TokenizerInfo:
    """`metadata` is the file's parsed header (see gguf_reader.read_gguf)."""
    if "tokenizer.ggml.tokens" not in metadata:
        raise CorruptModelFileError(path, "no tokenizer in the GGUF metadata (tokenizer.ggml.tokens)")
    tokenizer_type = _TOKENIZER_TYPES.get(str(metadata.get("general.architecture")))
    tokenizer = _cached_gguf_tokenizer(path, cache_dir or DEFAULT_CACHE_DIR, tokenizer_type)
    extra_stop_ids = [int(metadata[k]) for k in _GGUF_STOP_ID_KEYS if k in metadata]
    template = metadata.get("tokenizer.chat_template") or tokenizer.chat_template
    return _tokenizer_info(tokenizer, template, extra_stop_ids)


def load_hf_tokenizer(folder: Path) -> TokenizerInfo:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja, generation_config.json)."""
    try:
        tokenizer = _from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise CorruptModelFileError(folder, f"cannot load tokenizer ({_first_line(error)})") from None
    extra_stop_ids: list[int] = []
    generation_config = folder / "generation_config.json"
    if generation_config.is_file():
        eos = json.loads(generation_config.read_text()).get("eos_token_id")
        extra_stop_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return _tokenizer_info(tokenizer, tokenizer.chat_template, extra_stop_ids)


def _tokenizer_info(tokenizer: Any, chat_template: str | None, extra_stop_ids: list[int]) -> TokenizerInfo:
    vocab = tokenizer.get_vocab()
    stop_ids = [tokenizer.eos_token_id, *extra_stop_ids, *(vocab.get(t) for t in END_OF_TURN_TOKENS)]
    bos_id = tokenizer.bos_token_id
    # Whether encoding with special tokens prepends BOS: the tokenizer's own behaviour is the truth.
    with_special, without = tokenizer.encode("a"), tokenizer.encode("a", add_special_tokens=False)
    adds_bos = bos_id is not None and with_special[:1] == [bos_id] and without[:1] != [bos_id]
    return TokenizerInfo(
        tokenizer=tokenizer,
        chat_template=chat_template or None,
        bos_token_id=bos_id,
        eos_token_ids=tuple(dict.fromkeys(i for i in stop_ids if i is not None)),
        add_bos_token=adds_bos,
    )


def _cached_gguf_tokenizer(path: Path, cache_dir: Path, tokenizer_type: str | None = None) -> Any:
    entry = cache_dir / _cache_key(path)
    if (entry / "tokenizer.json").is_file():
        return _from_pretrained(entry)
    from transformers import AutoTokenizer

    try:
        named = {"tokenizer_type": tokenizer_type} if tokenizer_type else {}
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, **named)
    except (OSError, ValueError, KeyError) as error:
        raise CorruptModelFileError(
            path, f"cannot convert the GGUF tokenizer ({_first_line(error)})"
        ) from None
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".staging-"))
    tokenizer.save_pretrained(str(staging))
    try:
        staging.rename(entry)  # atomic: a concurrent loader sees all of the entry or none of it
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process won the race; its entry is equivalent
    return _from_pretrained(entry)


def _cache_key(path: Path) -> str:
    stat = path.stat()
    identity = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|transformers {transformers.__version__}"
    return hashlib.sha256(identity.encode()).hexdigest()[:24]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
