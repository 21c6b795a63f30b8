"""config.json translation, the registry, weight loading errors, sharding, fingerprints, bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.models.config import arch_config_from_hf
from kvserve.models.fingerprint import model_fingerprint
from kvserve.models.loader.safetensors import (
    WeightLoadError,
    iter_safetensors,
    load_hf_model,
    load_state_dict_into,
)
from kvserve.models.registry import UnsupportedModelError, build_model, get_model_class
from tests.models.helpers import PagedDriver, save_tiny_hf_model

GEMMA3_1B_STYLE = {  # transformers 4.x layout, as published for gemma-3-1b-it
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 32768,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
}


def test_gemma3_old_style_config() -> None:
    arch = arch_config_from_hf(GEMMA3_1B_STYLE)
    assert arch.architecture == "gemma3" and arch.tie_word_embeddings
    assert arch.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert (arch.sliding_window, arch.rope_local_base_freq, arch.rope_theta) == (512, 10000, 1e6)
    assert arch.rope_scaling is None and arch.query_pre_attn_scalar == 256


def test_gemma3_multimodal_config_uses_text_config() -> None:
    text = {**GEMMA3_1B_STYLE, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    arch = arch_config_from_hf({"model_type": "gemma3", "text_config": text, "vision_config": {}})
    assert arch.architecture == "gemma3"
    assert arch.rope_scaling_dict == {"rope_type": "linear", "factor": 8.0}


def test_llama3_rope_scaling_old_and_new_layouts_agree() -> None:
    base = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 131072,
    }
    scaling = {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    old = arch_config_from_hf({**base, "rope_theta": 500000.0, "rope_scaling": scaling})
    new = arch_config_from_hf({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert old == new and old.rope_theta == 500000.0 and old.rope_scaling_dict == scaling
    assert old.head_dim == 16 and old.num_key_value_heads == 4 and not old.attention_bias


def test_qwen2_has_qkv_bias_and_unknown_arch_is_rejected() -> None:
    arch = arch_config_from_hf({**GEMMA3_1B_STYLE, "model_type": "qwen2", "hidden_act": "silu"})
    assert arch.attention_bias and arch.layer_types == () and arch.sliding_window is None
    with pytest.raises(UnsupportedModelError, match="mamba"):
        get_model_class(arch_config_from_hf({**GEMMA3_1B_STYLE, "model_type": "mamba"}).architecture)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    save_tiny_hf_model("llama", path)
    return path


def test_load_errors_name_the_tensor(llama_dir: Path) -> None:
    loaded = load_hf_model(llama_dir, torch.float32)
    tensors = dict(iter_safetensors(llama_dir))
    fresh = build_model(loaded.arch, torch.float32, "cpu")
    with pytest.raises(WeightLoadError, match="k_proj|qkv_proj"):
        without_k = [(n, t) for n, t in tensors.items() if "layers.1.self_attn.k_proj" not in n]
        load_state_dict_into(fresh, without_k)
    with pytest.raises(WeightLoadError, match="model.bogus.weight"):
        load_state_dict_into(fresh, [*tensors.items(), ("model.bogus.weight", torch.zeros(1))])
    bad = {**tensors, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(WeightLoadError, match="model.norm.weight"):
        load_state_dict_into(fresh, bad.items())


def test_sharded_checkpoint_loads_identically(llama_dir: Path, tmp_path: Path) -> None:
    hf = save_tiny_hf_model("llama", tmp_path, seed=0)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    one, sharded = load_hf_model(llama_dir, torch.float32), load_hf_model(tmp_path, torch.float32)
    assert one.fingerprint == sharded.fingerprint


def test_fingerprint_tracks_data_and_dtype(llama_dir: Path) -> None:
    loaded = load_hf_model(llama_dir, torch.float32)
    state = dict(loaded.model.state_dict())
    assert model_fingerprint(loaded.arch, torch.float32, state.items()) == loaded.fingerprint
    assert model_fingerprint(loaded.arch, torch.bfloat16, state.items()) != loaded.fingerprint
    embed = state["model.embed_tokens.weight"].clone()  # 96 KiB: exercises the sampled path
    embed[0, 0] += 1.0  # the first window always includes byte 0
    changed = {**state, "model.embed_tokens.weight": embed}
    assert model_fingerprint(loaded.arch, torch.float32, changed.items()) != loaded.fingerprint


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bf16_is_as_accurate_as_hf_bf16(family: str, tmp_path: Path) -> None:
    hf = save_tiny_hf_model(family, tmp_path)
    ours = load_hf_model(tmp_path, torch.bfloat16).model
    assert ours.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    prompt = torch.randint(0, 384, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    driver = PagedDriver(ours)
    assert driver.caches[0].dtype == torch.bfloat16
    logits = torch.cat([driver.step([(0, prompt[:30])]), *(driver.step([(0, [t])]) for t in prompt[30:])])
    with torch.no_grad():
        exact = hf(torch.tensor([prompt])).logits[0]
        hf_bf16 = hf.to(torch.bfloat16)(torch.tensor([prompt])).logits[0].float()
    # Measured max |error| vs fp32: ours 0.06-0.07, HF bf16 0.065-0.10, on logits of magnitude ~4.
    ours_error, hf_error = (logits - exact).abs().max(), (hf_bf16 - exact).abs().max()
    assert ours_error < 1.5 * hf_error + 0.02
