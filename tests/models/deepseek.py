"""A test-only tiny random model in DeepSeek V3/V4 dress: a byte-level tokenizer with DeepSeek's
special tokens and a Jinja chat template that renders the reference's DSML format (ds4-server.md
§5.1-5.2, §6.3, §7), saved as an HF folder (config + safetensors + tokenizer.json) that
`kvserve serve --model FOLDER` loads like any other.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
# Control tokens never shown in output text; `<think>`, `</think>` and `｜DSML｜` are ordinary added
# tokens (decoded as text) so the reasoning segmenter and the DSML parser see them.
SPECIAL = (BOS, EOS, USER, ASSISTANT)
ADDED = ("<think>", "</think>", "｜DSML｜")

TOOLS_PREAMBLE = (
    "## Tools\n\nYou have access to a set of tools to help answer the user question. You can invoke tools "
    'by writing a "<｜DSML｜tool_calls>" block like the following:\n\n'
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    'String parameters should be specified as raw text and set `string="true"`. Preserve characters such '
    "as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity "
    "escapes. Only if a string value itself contains the exact closing parameter tag "
    "`</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all "
    'other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.'
    "\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_CLOSING = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. "
    "Use the exact parameter names from the schemas."
)

# ref §7 layout. Thinking is on unless `enable_thinking` is false; past reasoning is kept when any tool
# context exists or for an assistant turn after the last user turn (§6.3).
CHAT_TEMPLATE = (
    (
        "{%- set ns = namespace(tool_context=false, last_user=-1, system='', prev='') -%}"
        "{%- set thinking = enable_thinking is not defined or enable_thinking -%}"
        "{%- if tools -%}{%- set ns.tool_context = true -%}{%- endif -%}"
        "{%- for m in messages -%}"
        "{%- if m.role == 'tool' or m.tool_calls -%}{%- set ns.tool_context = true -%}{%- endif -%}"
        "{%- if m.role in ['user', 'tool'] -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
        "{%- endfor -%}"
        "{{ bos_token }}"
        "{%- if tools -%}"
        "{{ TOOLS_PREAMBLE }}"
        "{%- for t in tools -%}{% if not loop.first %}{{ '\\n' }}{% endif %}{{ t.function | tojson }}{%- endfor -%}"
        "{{ TOOLS_CLOSING }}"
        "{%- set ns.system = 'x' -%}"
        "{%- endif -%}"
        "{%- for m in messages if m.role == 'system' -%}"
        "{% if ns.system %}{{ '\\n\\n' }}{% endif %}{{ m.content }}{%- set ns.system = 'x' -%}"
        "{%- endfor -%}"
        "{%- for m in messages -%}"
        "{%- if m.role == 'user' -%}{{ '<｜User｜>' + m.content }}"
        "{%- elif m.role == 'tool' -%}"
        "{% if ns.prev != 'tool' %}{{ '<｜User｜>' }}{% endif %}"
        "{{ '<tool_result>' + m.content + '</tool_result>' }}"
        "{%- elif m.role == 'assistant' -%}"
        "{%- if ns.prev in ['user', 'tool'] -%}{{ '<｜Assistant｜>' }}"
        "{%- if thinking and (ns.tool_context or loop.index0 > ns.last_user) -%}"
        "{{ '<think>' + (m.reasoning_content or '') + '</think>' }}"
        "{%- else -%}{{ '</think>' }}{%- endif -%}"
        "{%- endif -%}"
        "{{ m.content }}"
        "{%- if m.tool_calls -%}"
        "{{ '\\n\\n<｜DSML｜tool_calls>\\n' }}"
        "{%- for call in m.tool_calls -%}"
        "{{ '<｜DSML｜invoke name=\"' }}{{ call.function.name | e }}{{ '\">\\n' }}"
        "{%- for key, value in call.function.arguments.items() -%}"
        "{%- if value is string -%}"
        "{{ '<｜DSML｜parameter name=\"' }}{{ key | e }}{{ '\" string=\"true\">' }}"
        "{{ value | replace('</｜DSML｜parameter>', '&lt;/｜DSML｜parameter>') }}"
        "{%- else -%}"
        "{{ '<｜DSML｜parameter name=\"' }}{{ key | e }}{{ '\" string=\"false\">' }}"
        "{{ value | tojson(separators=(',', ':')) }}"
        "{%- endif -%}"
        "{{ '</｜DSML｜parameter>\\n' }}"
        "{%- endfor -%}"
        "{{ '</｜DSML｜invoke>\\n' }}"
        "{%- endfor -%}"
        "{{ '</｜DSML｜tool_calls>' }}"
        "{%- endif -%}"
        "{{ '<｜end▁of▁sentence｜>' }}"
        "{%- endif -%}"
        "{%- if m.role != 'system' -%}{%- set ns.prev = m.role -%}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt and ns.prev in ['user', 'tool'] -%}"
        "{{ '<｜Assistant｜>' + ('<think>' if thinking else '</think>') }}"
        "{%- endif -%}"
    )
    .replace("{{ TOOLS_PREAMBLE }}", "{{ " + json.dumps(TOOLS_PREAMBLE) + " }}")
    .replace("{{ TOOLS_CLOSING }}", "{{ " + json.dumps(TOOLS_CLOSING) + " }}")
)


def save_deepseek_tokenizer(path: Path) -> None:
    """tokenizer.json (byte-level BPE over 256 byte tokens + DeepSeek's tokens) and its config."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 1_000_000,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))


def save_tiny_deepseek_model(path: Path, seed: int = 0, max_position_embeddings: int = 4096) -> Path:
    """The folder: a tiny random llama-architecture model with the DeepSeek-style tokenizer, with room
    for the tools block (about 1.4K byte tokens)."""
    import torch
    import transformers

    from tests.models.helpers import TINY

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        **{**TINY, "max_position_embeddings": max_position_embeddings},
        tie_word_embeddings=True,
        bos_token_id=256,  # the tokenizer's BOS and EOS (generation_config.json names stop ids)
        eos_token_id=257,
    )
    config.initializer_range = 0.1
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    save_deepseek_tokenizer(path)
    return path
