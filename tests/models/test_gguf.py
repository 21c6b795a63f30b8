"""GGUF loading: dequantization, metadata → config, names and llama.cpp's layout changes, errors.

Synthetic files are written with gguf-py's own `GGUFWriter` and tensor name map, from tiny
random HF models, so names and layouts are checked against llama.cpp's conventions rather
than against our own tables.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from kvserve.models.errors import CorruptModelFileError, ModelNotFoundError, UnsupportedModelError
from kvserve.models.loader import load_model
from kvserve.models.loader.gguf import dequantize, iter_hf_tensors, read_gguf_config
from kvserve.models.loader.gguf_config import _llama3_freq_factors
from tests.models.gguf_files import write_gguf
from tests.models.helpers import TINY, make_tiny_hf_model

# -- dequantization --------------------------------------------------------------------------

# Worst-case |error| relative to the block's max |value| for a quantize → dequantize round trip.
ROUND_TRIP_TOLERANCE = {Q.Q4_0: 0.15, Q.Q4_1: 0.1, Q.Q5_0: 0.07, Q.Q5_1: 0.05, Q.Q8_0: 0.01, Q.BF16: 0.01}


@pytest.mark.parametrize("qtype", list(ROUND_TRIP_TOLERANCE), ids=lambda t: t.name)
def test_dequantize_round_trip(qtype: Q) -> None:
    num_rows = 300  # more than one of the 256-row chunks `dequantize` works in
    values = np.random.default_rng(0).standard_normal((num_rows, 256)).astype(np.float32)
    raw = gguf.quants.quantize(values, qtype)
    ours = dequantize(raw, qtype, (num_rows, 256))
    assert ours.dtype == torch.float32 and ours.shape == (num_rows, 256)
    np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(raw, qtype))
    block_max = np.abs(values).reshape(num_rows, -1, 32).max(axis=-1, keepdims=True)
    error = np.abs(ours.numpy() - values).reshape(num_rows, -1, 32)
    assert (error <= block_max * ROUND_TRIP_TOLERANCE[qtype]).all()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_dequantize_float_types_exact(qtype: Q) -> None:
    values = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    torch_dtype = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}[qtype]
    stored = values.to(torch_dtype)
    raw = stored.view(torch.uint8).numpy().reshape(4, -1)
    torch.testing.assert_close(dequantize(raw, qtype, (4, 64)), stored.float(), atol=0, rtol=0)


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _f16(b: bytes) -> float:
    return float(np.frombuffer(b, dtype=np.float16)[0])


def _ref_q4_k(block: bytes) -> list[float]:
    """ggml-quants.c dequantize_row_q4_K, one block, written out scalar."""
    d, dmin, scales, qs = _f16(block[0:2]), _f16(block[2:4]), block[4:16], block[16:144]
    out = []
    for j in range(4):
        sc1, m1 = _scale_min_k4(2 * j, scales)
        sc2, m2 = _scale_min_k4(2 * j + 1, scales)
        q = qs[32 * j : 32 * j + 32]
        out += [d * sc1 * (b & 0xF) - dmin * m1 for b in q] + [d * sc2 * (b >> 4) - dmin * m2 for b in q]
    return out


def _ref_q5_k(block: bytes) -> list[float]:
    d, dmin, scales, qh, qs = _f16(block[0:2]), _f16(block[2:4]), block[4:16], block[16:48], block[48:176]
    out = []
    for j in range(4):
        sc1, m1 = _scale_min_k4(2 * j, scales)
        sc2, m2 = _scale_min_k4(2 * j + 1, scales)
        q, u1, u2 = qs[32 * j : 32 * j + 32], 1 << (2 * j), 2 << (2 * j)
        out += [d * sc1 * ((b & 0xF) + (16 if qh[i] & u1 else 0)) - dmin * m1 for i, b in enumerate(q)]
        out += [d * sc2 * ((b >> 4) + (16 if qh[i] & u2 else 0)) - dmin * m2 for i, b in enumerate(q)]
    return out


def _ref_q6_k(block: bytes) -> list[float]:
    ql, qh, sc, d = block[0:128], block[128:192], np.frombuffer(block[192:208], np.int8), _f16(block[208:210])
    out = [0.0] * 256
    for n in range(2):
        base_l, base_h, base_s, y = 64 * n, 32 * n, 8 * n, 128 * n
        for j in range(32):
            s = base_s + j // 16
            lo, hi, h = ql[base_l + j], ql[base_l + j + 32], qh[base_h + j]
            out[y + j] = d * sc[s] * (((lo & 0xF) | ((h & 3) << 4)) - 32)
            out[y + j + 32] = d * sc[s + 2] * (((hi & 0xF) | (((h >> 2) & 3) << 4)) - 32)
            out[y + j + 64] = d * sc[s + 4] * (((lo >> 4) | (((h >> 4) & 3) << 4)) - 32)
            out[y + j + 96] = d * sc[s + 6] * (((hi >> 4) | (((h >> 6) & 3) << 4)) - 32)
    return out


K_QUANTS = {Q.Q4_K: (_ref_q4_k, (0, 2)), Q.Q5_K: (_ref_q5_k, (0, 2)), Q.Q6_K: (_ref_q6_k, (208,))}


@pytest.mark.parametrize("qtype", list(K_QUANTS), ids=lambda t: t.name)
def test_dequantize_k_quants_match_scalar_reference(qtype: Q) -> None:
    reference, f16_offsets = K_QUANTS[qtype]
    rng = np.random.default_rng(2)
    num_rows, blocks_per_row = 2, 2
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (num_rows * blocks_per_row, block_bytes), dtype=np.uint8)
    for offset in f16_offsets:  # random bytes can spell inf/NaN scales; write finite ones
        raw[:, offset : offset + 2] = rng.uniform(0.01, 0.1, (len(raw), 1)).astype(np.float16).view(np.uint8)
    ours = dequantize(raw.reshape(num_rows, -1), qtype, (num_rows, 256 * blocks_per_row))
    expected = np.concatenate([reference(bytes(block)) for block in raw]).reshape(num_rows, -1)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=1e-6)


# -- synthetic GGUF files --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama() -> torch.nn.Module:
    return make_tiny_hf_model("llama_tied")


@pytest.fixture(scope="module")
def tiny_llama_gguf(tiny_llama: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", tiny_llama, "llama")


def test_metadata_translates_to_hf_config(tiny_llama: torch.nn.Module, tiny_llama_gguf: Path) -> None:
    _, config = read_gguf_config(tiny_llama_gguf)
    hf = tiny_llama.config
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    ):
        assert config[key] == getattr(hf, key), key
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["rope_scaling"] is None and config["rope_theta"] == 10_000.0
    assert config["rms_norm_eps"] == pytest.approx(hf.rms_norm_eps)


@pytest.mark.parametrize(
    "family,arch", [("llama_tied", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3"), ("gemma3", "gemma3")]
)
def test_tensors_come_back_under_hf_names_and_layouts(family: str, arch: str, tmp_path: Path) -> None:
    hf_model = make_tiny_hf_model(family)
    gguf_file, config = read_gguf_config(write_gguf(tmp_path / f"{family}.gguf", hf_model, arch))
    ours = dict(iter_hf_tensors(gguf_file, config, torch.float32, progress=False))
    expected = {
        k: v
        for k, v in hf_model.state_dict().items()
        if not (k == "lm_head.weight" and config["tie_word_embeddings"])
    }
    assert ours.keys() == expected.keys()
    for name, tensor in expected.items():
        # Gemma norms round-trip through w + 1 - 1 in float32.
        torch.testing.assert_close(ours[name], tensor, atol=1e-6 if arch == "gemma3" else 0, rtol=0, msg=name)


def test_quantized_tensors_load_in_the_requested_dtype(tiny_llama: torch.nn.Module, tmp_path: Path) -> None:
    gguf_file, config = read_gguf_config(write_gguf(tmp_path / "q8.gguf", tiny_llama, "llama", qtype=Q.Q8_0))
    ours = dict(iter_hf_tensors(gguf_file, config, torch.bfloat16, progress=False))
    assert all(t.dtype == torch.bfloat16 for t in ours.values())
    expected = tiny_llama.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    torch.testing.assert_close(
        ours["model.layers.0.self_attn.q_proj.weight"].float(), expected, atol=0.02, rtol=0.02
    )


def test_gemma3_config_follows_llama_cpp(tmp_path: Path) -> None:
    hf_model = make_tiny_hf_model("gemma3")
    _, config = read_gguf_config(write_gguf(tmp_path / "gemma.gguf", hf_model, "gemma3"))
    assert config["model_type"] == "gemma3_text"
    assert config["layer_types"] == ["sliding_attention"] * 4  # every 6th layer is global; this one has 4
    assert config["sliding_window"] == hf_model.config.sliding_window
    assert config["query_pre_attn_scalar"] == config["head_dim"] == 32
    assert config["rope_local_base_freq"] == 10_000.0
    assert config["hidden_activation"] == "gelu_pytorch_tanh"


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "yarn",
            "factor": 2.5,
            "original_max_position_embeddings": 128,
            "attention_factor": 0.75,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
    ],
)
def test_rope_scaling_metadata_becomes_hf_rope_scaling(
    tiny_llama: torch.nn.Module, tmp_path: Path, scaling: dict
) -> None:
    """`{arch}.rope.scaling.*` as llama.cpp's converter writes it (gguf-py's writer) come back as
    the rope_scaling transformers had, so the same inverse frequencies and attention factor."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from kvserve.models.config import arch_config_from_hf
    from kvserve.models.layers.rotary import rope_init

    path = write_gguf(tmp_path / "scaled.gguf", tiny_llama, "llama", rope_scaling=scaling)
    _, config = read_gguf_config(path)
    assert config["rope_scaling"] == scaling
    arch = arch_config_from_hf(config)
    hf_config = transformers.LlamaConfig(
        **TINY, head_dim=arch.head_dim, rope_theta=arch.rope_theta, rope_scaling=dict(scaling)
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_config, "cpu")
    ours = rope_init(arch.head_dim, arch.rope_theta, arch.rope_scaling_dict)
    assert torch.equal(ours.inv_freq, inv_freq) and ours.attention_factor == attention_factor


def test_llama3_rope_scaling_recovered_from_rope_freqs() -> None:
    """rope_freqs as llama.cpp writes them for Llama 3.2 (factor 32) map back to HF's rope_scaling."""
    from kvserve.models.loader.gguf_config import _llama3_rope_scaling
    from kvserve.models.loader.gguf_reader import GGUFFile, GGUFTensorInfo

    factors = _llama3_freq_factors(500_000.0, 64, 32.0)
    assert factors[0] == 1.0 and factors[-1] == 32.0  # high frequencies untouched, low ones scaled
    blob = factors.view(np.uint8)
    info = GGUFTensorInfo("rope_freqs.weight", (32,), Q.F32, 0, blob.nbytes)
    file = GGUFFile(Path("x.gguf"), {}, (info,), blob)
    meta = {"rope.freq_base": 500_000.0, "rope.dimension_count": 64}
    scaling = _llama3_rope_scaling(file, lambda name, default=None: meta.get(name, default))
    assert scaling == {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert math.isclose(float(factors[10]), float(_llama3_freq_factors(500_000.0, 64, 32.0)[10]))


# -- errors ----------------------------------------------------------------------------------


def _assert_one_line(error: pytest.ExceptionInfo, path: Path, *words: str) -> None:
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert all(word in message for word in words), message


def test_truncated_file_is_a_corrupt_file_error(tiny_llama_gguf: Path, tmp_path: Path) -> None:
    data = tiny_llama_gguf.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 100, 30):
        truncated = tmp_path / f"cut{cut}.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(CorruptModelFileError) as error:
            read_gguf_config(truncated)
        _assert_one_line(error, truncated, "truncated")


@pytest.mark.parametrize(
    "content", [b"", b"GGU", bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8))]
)
def test_non_gguf_bytes_are_a_corrupt_file_error(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(content)
    with pytest.raises(CorruptModelFileError) as error:
        read_gguf_config(path)
    _assert_one_line(error, path, "not a GGUF file")


def test_garbage_after_a_valid_magic_is_a_corrupt_file_error(tmp_path: Path) -> None:
    path = tmp_path / "magic.gguf"
    path.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 1, 1)
        + bytes(np.random.default_rng(4).integers(0, 256, 512, dtype=np.uint8))
    )
    with pytest.raises(CorruptModelFileError) as error:
        read_gguf_config(path)
    _assert_one_line(error, path)


def test_missing_file_and_bad_folder_are_not_found_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as error:
        load_model(tmp_path / "nope.gguf", torch.float32, progress=False)
    _assert_one_line(error, tmp_path / "nope.gguf", "no such file")
    with pytest.raises(ModelNotFoundError) as error:
        load_model(tmp_path, torch.float32, progress=False)
    _assert_one_line(error, tmp_path, "config.json")


def _write_minimal(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, Q]]) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    for key, value in {
        "context_length": 64,
        "embedding_length": 256,
        "block_count": 1,
        "feed_forward_length": 256,
        "attention.head_count": 4,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for name, (values, qtype) in tensors.items():
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unknown_architecture_is_unsupported(tmp_path: Path) -> None:
    path = _write_minimal(
        tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": (np.zeros((4, 256), np.float32), Q.F32)}
    )
    with pytest.raises(UnsupportedModelError) as error:
        read_gguf_config(path)
    _assert_one_line(error, path, "'gpt2'")


def test_unsupported_tensor_type_is_reported_before_any_tensor_is_read(tmp_path: Path) -> None:
    embedding = np.zeros((4, 256), np.float32)
    path = _write_minimal(
        tmp_path / "tq.gguf",
        "llama",
        {"output_norm.weight": (np.ones(256, np.float32), Q.F32), "token_embd.weight": (embedding, Q.TQ2_0)},
    )
    gguf_file, config = read_gguf_config(path)
    tensors = iter_hf_tensors(gguf_file, config, torch.float32, progress=False)
    with pytest.raises(UnsupportedModelError) as error:
        next(tensors)
    _assert_one_line(error, path, "TQ2_0")


def test_unknown_tensor_type_id_is_unsupported(tmp_path: Path) -> None:
    path = _write_minimal(
        tmp_path / "id.gguf", "llama", {"token_embd.weight": (np.zeros((4, 256), np.float32), Q.F32)}
    )
    data = bytearray(path.read_bytes())
    name = b"token_embd.weight"
    dims_at = data.find(name) + len(name)
    (num_dims,) = struct.unpack_from("<I", data, dims_at)
    struct.pack_into("<I", data, dims_at + 4 + 8 * num_dims, 99)
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError) as error:
        read_gguf_config(path)
    _assert_one_line(error, path, "type id 99")


@pytest.mark.parametrize(
    ("qtype", "expected"),
    [(Q.Q4_0, "int4"), (Q.Q4_1, "int4"), (Q.Q5_0, "int8"), (Q.Q8_0, "int8"), (Q.F16, None), (Q.F32, None)],
)
def test_file_weight_quant_is_the_low_bit_copy_that_holds_the_layers(
    tiny_llama: torch.nn.Module, tmp_path: Path, qtype: Q, expected: str | None
) -> None:
    """--weight-quant auto's input: int4 holds 2-4-bit layers, int8 5-8-bit ones, none 16/32-bit."""
    from kvserve.models.loader.gguf import file_weight_quant

    path = write_gguf(tmp_path / f"{qtype.name}.gguf", tiny_llama, "llama", qtype=qtype)
    assert file_weight_quant(read_gguf_config(path)[0]) == expected


def test_file_weight_quant_of_a_mixed_file_is_its_widest_layer() -> None:
    """A Q4_K_M file keeps some tensors in Q6_K: int4 would lose their precision, int8 holds both."""
    from types import SimpleNamespace

    from kvserve.models.loader.gguf import file_weight_quant

    def file(*types: Q) -> SimpleNamespace:
        tensors = [
            SimpleNamespace(name=f"blk.{i}.ffn_up.weight", shape=(64, 32), ggml_type=t)
            for i, t in enumerate(types)
        ]
        tensors.append(
            SimpleNamespace(name="token_embd.weight", shape=(64, 32), ggml_type=Q.F32)
        )  # not a layer
        return SimpleNamespace(tensors=tensors)

    assert file_weight_quant(file(Q.Q4_K, Q.Q4_0)) == "int4"
    assert file_weight_quant(file(Q.Q4_K, Q.Q6_K)) == "int8"
    assert file_weight_quant(file(Q.Q4_K, Q.F16)) is None
    assert file_weight_quant(file()) is None
