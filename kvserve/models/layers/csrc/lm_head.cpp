// The LM head of low-bit fp32 decode: int8 (Q8_0) weights, fp32 input, greedy-exact at about half the
// cost of the fp32-input GEMV.
//
// Why: rounding the head's input to int8 (ggml's Q8_0 x Q8_0, what llama.cpp does) flipped SmolLM2's
// greedy answers, so the head ran the int8 weights on the fp32 input, ~2x the integer path's compute
// and the largest single cost of a one-stream step. Here every logit is first computed on the integer
// path; the error of that is bounded per vocabulary row n by
//   |exact_n - approx_n| <= L1(w_n) * (max_g dx_g / 2) + float slack,
// (dx_g: the input's int8 step in group g; L1(w_n): the row's dequantized L1 norm, precomputed), so
// only the rows whose bound reaches the best lower bound can be the argmax, and those (a handful) are
// recomputed on the fp32 input with the same code as lowbit_linear(quantize_x=False). The argmax, and
// every logit near it, are then bit for bit what that path gives; logits far below it keep the integer
// path's value (the error bound above).
#include "cpu_kernels.h"
#include "lowbit_dot.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using namespace lowbit;

torch::Tensor lm_head_logits(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                             const torch::Tensor& row_l1) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous fp32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0), G = K / QK;
  TORCH_CHECK(qweight.scalar_type() == torch::kInt8 && qweight.is_contiguous() && qweight.size(1) == K);
  TORCH_CHECK(K % QK == 0 && scales.is_contiguous() && scales.size(0) == N && scales.size(1) == G, "scales");
  TORCH_CHECK(row_l1.scalar_type() == torch::kFloat32 && row_l1.numel() == N, "row_l1: fp32 [N]");
  const float* xf = x.data_ptr<float>();
  const int8_t* w = qweight.data_ptr<int8_t>();
  const at::Half* sc = scales.data_ptr<at::Half>();
  const float* l1 = row_l1.data_ptr<float>();
  const QuantRows xq = quantize_rows(xf, M, K, nullptr, 0.f);
  auto out = torch::empty({M, N}, x.options());
  float* y = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    float v[4];
    for (int64_t n = begin; n < end; ++n) {
      const auto* wn = reinterpret_cast<const uint8_t*>(w + n * K);
      for (int64_t m = 0; m < M; m += 4) {
        const int r = static_cast<int>(std::min<int64_t>(4, M - m));
        const int8_t* qx = xq.q.data() + m * K;
        const float* dx = xq.d.data() + m * G;
        switch (r) {
          case 1: dot_rows<8, 1>(wn, sc + n * G, qx, dx, K, G, v); break;
          case 2: dot_rows<8, 2>(wn, sc + n * G, qx, dx, K, G, v); break;
          case 3: dot_rows<8, 3>(wn, sc + n * G, qx, dx, K, G, v); break;
          default: dot_rows<8, 4>(wn, sc + n * G, qx, dx, K, G, v); break;
        }
        for (int i = 0; i < r; ++i) y[(m + i) * N + n] = v[i];
      }
    }
  });
  std::vector<int64_t> exact;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = xf + m * K;
    float amax = 0.f, max_dx = 0.f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(xm[k]));
    for (int64_t g = 0; g < G; ++g) max_dx = std::max(max_dx, xq.d[m * G + g]);
    // Rounding error (half a step, with margin for 1/d's own rounding) plus float slack for both
    // paths' accumulation (~K * 2^-24 relative to sum |w| |x|, far below 1e-5 for these K).
    const float c = 0.5005f * max_dx + 1e-5f * amax;
    float* ym = y + m * N;
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < N; ++n) best = std::max(best, ym[n] - c * l1[n]);
    exact.clear();
    for (int64_t n = 0; n < N; ++n) {
      if (ym[n] + c * l1[n] >= best) exact.push_back(n);
    }
    // lowbit_linear(quantize_x=False) takes rows 4 at a time; a lone last row takes dot_row_q8_f32.
    const bool alone = m % 4 == 0 && m + 1 == M;
    at::parallel_for(0, static_cast<int64_t>(exact.size()), 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t n = exact[i];
        if (alone) {
          ym[n] = dot_row_q8_f32(w + n * K, sc + n * G, xm, G);
        } else {
          dot_rows_q8_f32_prescaled<1>(w + n * K, sc + n * G, xm, K, G, ym + n);
        }
      }
    });
  }
  return out;
}
