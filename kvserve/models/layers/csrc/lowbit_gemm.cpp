// The op around lowbit_gemm.h's tile: activation rounding, blocking, threads, bias and N tails.
#include "cpu_kernels.h"
#include "hreduce.h"
#include "lowbit_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace lowbit;

namespace {

constexpr int64_t ROWS_PER_CHUNK = 64;  // the activations of a chunk stay in L1/L2 over all column blocks

// x [M, K] -> int8 per group of 32 (as quantize_rows, vectorized): q, scale d, d * sum(q).
void quantize_groups(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t G = K / 32;
  const __m256 sign = _mm256_set1_ps(-0.f);
  at::parallel_for(0, M * G, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xg = x + i * 32;
      __m256 v[4], amax = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j] = _mm256_loadu_ps(xg + 8 * j)));
      const float dg = hmax(amax) / 127.f;
      const __m256 id = _mm256_set1_ps(dg > 0.f ? 1.f / dg : 0.f);
      __m256i qi[4];
      for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      // int32 -> int8 in order: packs interleave the 128-bit lanes, the permute puts them back.
      const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * 32), p8);
      const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      d[i] = dg;
      s[i] = dg * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
  });
}

}  // namespace

// y = x @ W^T (+ bias) for x [M, K] fp32 and W in lowbit_gemm.h's blocked int4 layout, N outputs.
torch::Tensor lowbit_gemm(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                          int64_t N, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous fp32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, NB = (N + 7) / 8;
  TORCH_CHECK(K % 32 == 0 && qweight.is_contiguous() && scales.is_contiguous(), "K % 32, contiguous weights");
  TORCH_CHECK(qweight.scalar_type() == torch::kUInt8 && qweight.numel() == NB * G * 128, "qweight: uint8 [N/8, G, 4, 32]");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.numel() == NB * G * 16, "scales: fp32 [N/8, G, 2, 8]");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N, "bias");
    b = bias->data_ptr<float>();
  }
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * G), sx(M * G);
  quantize_groups(x.data_ptr<float>(), M, K, qx.data(), dx.data(), sx.data());
  auto out = torch::empty({M, N}, x.options());
  float* y = out.data_ptr<float>();
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const float* sc = scales.data_ptr<float>();
  for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_CHUNK) {
    const int64_t m1 = std::min(M, m0 + ROWS_PER_CHUNK);
    at::parallel_for(0, NB, 4, [&](int64_t begin, int64_t end) {
      __m256 tile[4];
      alignas(32) float row[8];
      for (int64_t nb = begin; nb < end; ++nb) {
        const uint8_t* wb = w + nb * G * 128;
        const float* sb = sc + nb * G * 16;
        const int64_t n0 = nb * 8, cols = std::min<int64_t>(8, N - n0);
        for (int64_t m = m0; m < m1; m += 4) {
          const int r = static_cast<int>(std::min<int64_t>(4, m1 - m));
          const int8_t* q = qx.data() + m * K;
          const float* d = dx.data() + m * G;
          const float* s = sx.data() + m * G;
          switch (r) {
            case 1: gemm_tile_q4<1>(wb, sb, q, d, s, K, G, tile); break;
            case 2: gemm_tile_q4<2>(wb, sb, q, d, s, K, G, tile); break;
            case 3: gemm_tile_q4<3>(wb, sb, q, d, s, K, G, tile); break;
            default: gemm_tile_q4<4>(wb, sb, q, d, s, K, G, tile); break;
          }
          for (int i = 0; i < r; ++i) {
            __m256 v = tile[i];
            float* yr = y + (m + i) * N + n0;
            if (cols == 8) {
              if (b != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(b + n0));
              _mm256_storeu_ps(yr, v);
            } else {  // the last block of an N that is not a multiple of 8 (padded with zero weights)
              _mm256_store_ps(row, v);
              for (int64_t c = 0; c < cols; ++c) yr[c] = row[c] + (b != nullptr ? b[n0 + c] : 0.f);
            }
          }
        }
      }
    });
  }
  return out;
}
