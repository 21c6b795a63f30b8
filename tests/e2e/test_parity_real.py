"""Real-model parity: kvserve's GGUF loading + model vs transformers loading the same GGUF.

Greedy output must be identical for 64 new tokens on 5 prompts (one long enough to cross
Gemma 3's 512-token sliding window), and every step's logits must agree within LOGITS_ATOL,
in fp32. Our side runs the 5 prompts as one batch through the paged driver (batched
prefill, then batched decode steps). transformers checks it teacher-forced: one forward
over prompt + our 64 tokens must put its argmax on our token at every step, which is
exactly "its greedy decode produces the same 64 tokens", at 1/64 of the cost of 64 decode
steps per prompt; one prompt also goes through `generate()` itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from unittest import mock

import gguf
import pytest
import torch
from torch import nn

from kvserve.models.aliases import list_known_models
from kvserve.models.loaded import LoadedModel
from kvserve.models.loader import ContextRequest, load_model
from tests.models.helpers import PagedDriver

pytestmark = [pytest.mark.model, pytest.mark.slow]

NUM_NEW_TOKENS = 64
NUM_GENERATE_TOKENS = 16  # the generate() cross-check; the 64-token check is teacher-forced
# Measured max |diff| over all steps and prompts: 8.2e-5 (SmolLM2), 7.8e-5 (Gemma 3 270M).
LOGITS_ATOL = 1e-3
_LONG_TEXT = " ".join(
    f"Entry {i}: the warehouse in district {i % 7} shipped {3 * i + 11} crates of {('nuts', 'bolts')[i % 2]}."
    for i in range(30)
)
CHAT_QUESTIONS = ["What is the capital of France?", "Write a Python function that reverses a string."]
RAW_TEXTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    _LONG_TEXT + "\nQuestion: how many crates did district 3 ship?",
]


@dataclass
class Pair:
    ours: LoadedModel
    hf: nn.Module
    prompts: list[list[int]]


def _prompts(loaded: LoadedModel) -> list[list[int]]:
    tokenizer = loaded.tokenizer.tokenizer
    prompts = [tokenizer.encode(text) for text in RAW_TEXTS]
    for question in CHAT_QUESTIONS:
        if loaded.tokenizer.chat_template is None:  # a base model: plain text
            prompts.append(tokenizer.encode(question))
        else:
            messages = [{"role": "user", "content": question}]
            text = tokenizer.apply_chat_template(
                messages,
                chat_template=loaded.tokenizer.chat_template,
                tokenize=False,
                add_generation_prompt=True,
            )
            prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


@pytest.fixture(scope="module", params=["smollm2", "gemma3-270m"])
def pair(request: pytest.FixtureRequest) -> Pair:
    from transformers import AutoModelForCausalLM

    known = next(m for m in list_known_models() if m.name == request.param)
    if known.path is None:
        pytest.skip(f"{known.package} is not installed")
    ours = load_model(request.param, torch.float32, progress=False)
    # from_pretrained reads the GGUF twice (config, then weights), each time with a new gguf-py
    # GGUFReader, whose pure-Python field parse (Gemma's 262K-token vocabulary) is most of the
    # load: one reader serves both reads. transformers imports GGUFReader inside the function.
    with mock.patch("gguf.GGUFReader", functools.cache(gguf.GGUFReader)):
        hf = AutoModelForCausalLM.from_pretrained(
            str(ours.path.parent), gguf_file=ours.path.name, dtype=torch.float32
        )
    hf.eval()
    hf.generation_config.eos_token_id = None  # always generate all 64 tokens, like our driver
    hf.generation_config.pad_token_id = 0
    return Pair(ours, hf, _prompts(ours))


def _ours_greedy(model: nn.Module, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """All prompts as one batch. Returns tokens per prompt and logits [num_prompts, steps, vocab]."""
    driver = PagedDriver(
        model, num_blocks=sum(len(p) + NUM_NEW_TOKENS for p in prompts) // 16 + 16, block_size=16
    )
    logits = driver.step(list(enumerate(prompts)))
    last_rows = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    step_logits = [logits[last_rows]]  # [num_prompts, vocab]
    for _ in range(NUM_NEW_TOKENS - 1):
        next_ids = step_logits[-1].argmax(-1).tolist()
        step_logits.append(driver.step([(i, [t]) for i, t in enumerate(next_ids)]))
    stacked = torch.stack(step_logits, dim=1)  # [num_prompts, steps, vocab]
    return stacked.argmax(-1).tolist(), stacked


def _hf_teacher_forced(hf: nn.Module, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """transformers' logits at each of the 64 decode steps, given our continuation: [steps, vocab]."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + continuation])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(continuation)]


def test_greedy_output_and_logits_match_transformers(pair: Pair) -> None:
    assert len(pair.prompts) == 5 and max(len(p) for p in pair.prompts) > 512
    ours_tokens, ours_logits = _ours_greedy(pair.ours.model, pair.prompts)
    max_diff = 0.0
    for i, prompt in enumerate(pair.prompts):
        hf_logits = _hf_teacher_forced(pair.hf, prompt, ours_tokens[i])
        hf_choice = hf_logits.argmax(-1).tolist()
        diverged = [k for k, (a, b) in enumerate(zip(ours_tokens[i], hf_choice, strict=True)) if a != b]
        assert not diverged, f"prompt {i}: transformers' greedy choice differs first at step {diverged[:1]}"
        max_diff = max(max_diff, (ours_logits[i] - hf_logits).abs().max().item())
    print(
        f"\n{pair.ours.path.name}: max |logit diff| over {NUM_NEW_TOKENS} steps x 5 prompts = {max_diff:.2e}"
    )
    assert max_diff < LOGITS_ATOL


def test_generate_matches_transformers_generate(pair: Pair) -> None:
    prompt = min(pair.prompts, key=len)
    with torch.no_grad():
        expected = pair.hf.generate(
            torch.tensor([prompt]), max_new_tokens=NUM_GENERATE_TOKENS, do_sample=False
        )
    driver = PagedDriver(pair.ours.model, num_blocks=16, block_size=16)
    assert driver.generate(0, prompt, NUM_GENERATE_TOKENS) == expected[0, len(prompt) :].tolist()


def test_yarn_past_the_trained_context_matches_transformers(pair: Pair) -> None:
    """`--ctx 32768` on SmolLM2 (trained at 8,192): the YaRN x4 model kvserve builds against
    transformers' LlamaRotaryEmbedding with the same rope_parameters, on the same weights, at
    positions 9,000+ (position_ids offset: both attend only over the short sequence itself)."""
    import copy

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if pair.ours.arch.architecture != "llama":
        pytest.skip("SmolLM2 is the default model run past its trained context")
    ours = load_model("smollm2", torch.float32, progress=False, context=ContextRequest(max_model_len=32768))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    assert ours.max_model_len == 32768 and ours.arch.rope_scaling_dict == yarn
    config = copy.deepcopy(pair.hf.config)
    config.rope_parameters = {**yarn, "rope_theta": config.rope_parameters["rope_theta"]}
    prompt, offset = pair.prompts[3], 9000  # the chat question
    position_ids = torch.arange(offset, offset + len(prompt) + 16)[None]
    unscaled = pair.hf.model.rotary_emb
    try:
        pair.hf.model.rotary_emb = LlamaRotaryEmbedding(config)
        continuation = PagedDriver(ours.model, position_offset=offset).generate(0, prompt, 16)
        with torch.no_grad():
            expected = pair.hf(torch.tensor([prompt + continuation]), position_ids=position_ids).logits[0]
    finally:
        pair.hf.model.rotary_emb = unscaled
    driver = PagedDriver(ours.model, num_blocks=16, block_size=16, position_offset=offset)
    got = torch.cat([driver.step([(0, prompt)]), *(driver.step([(0, [t])]) for t in continuation[:-1])])
    max_diff = (got - expected[:-1]).abs().max().item()
    print(f"\nSmolLM2 YaRN x4 at positions {offset}+: max |logit diff| = {max_diff:.2e}")
    assert max_diff < LOGITS_ATOL
    assert expected[len(prompt) - 1 : -1].argmax(-1).tolist() == continuation  # the same greedy tokens


def test_loaded_model_metadata(pair: Pair) -> None:
    loaded, tokenizer = pair.ours, pair.ours.tokenizer
    assert loaded.max_model_len == {"llama": 8192, "gemma3": 32768}[loaded.arch.architecture]
    assert len(loaded.fingerprint) == 32 and loaded.dtype == torch.float32
    end_of_turn = "<|im_end|>" if loaded.arch.architecture == "llama" else "<end_of_turn>"
    assert tokenizer.tokenizer.convert_tokens_to_ids(end_of_turn) in tokenizer.eos_token_ids
    assert tokenizer.add_bos_token is (loaded.arch.architecture == "gemma3")
