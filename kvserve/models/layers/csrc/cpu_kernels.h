// AVX2 kernels for CPU decode, built at first use by ../cpu_ext.py (see the .cpp files for why).
#pragma once

#include <torch/extension.h>

torch::Tensor lowbit_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                            int64_t bits, const c10::optional<torch::Tensor>& bias,
                            const c10::optional<torch::Tensor>& residual,
                            const c10::optional<torch::Tensor>& norm_weight, double eps, bool gated,
                            bool quantize_x, const c10::optional<torch::Tensor>& packed, int64_t act,
                            const c10::optional<torch::Tensor>& post_norm, double post_eps);

torch::Tensor lowbit_gemm(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                          int64_t N, const c10::optional<torch::Tensor>& bias);

torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& cache, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                               int64_t num_heads, int64_t num_kv_heads, double scale, int64_t window,
                               const c10::optional<torch::Tensor>& q_norm,
                               const c10::optional<torch::Tensor>& k_norm, double norm_eps);

torch::Tensor prefill_attention(const torch::Tensor& q, const torch::Tensor& cache,
                                const torch::Tensor& block_table, int64_t context_len, double scale,
                                int64_t window, bool vnni, int64_t query_tile, int64_t key_block);

void bind_decode_stack(pybind11::module& m);  // the DecodeStack class (decode_stack.cpp)
