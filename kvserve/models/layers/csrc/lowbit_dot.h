// The dot products of the low-bit kernels (ggml's Q4_1 / Q8_0 weights against int8 or fp32 activations),
// used by lowbit_linear.cpp (the fused linears).
// Formats: see lowbit_linear.cpp.
#pragma once

#include "hreduce.h"
#include "rms_norm.h"

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lowbit {

constexpr int64_t QK = 32;

struct QuantRows {  // activation rows quantized per group of 32
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, G] scale
  std::vector<float> s;    // [M, G] d * sum(q): the group sum, for int4's min term
};

inline float fp16(const at::Half* p) { return _cvtsh_ss(reinterpret_cast<const uint16_t&>(*p)); }

// x [M, K] (optionally RMS-normalized with weight `norm`) -> int8 groups of 32.
inline QuantRows quantize_rows(const float* x, int64_t M, int64_t K, const float* norm, float eps) {
  const int64_t G = K / QK;
  QuantRows r{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(M * G)};
  std::vector<float> row(K);
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    if (norm != nullptr) {
      rms_norm_row(xm, norm, eps, row.data(), K);
      xm = row.data();
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = xm + g * QK;
      float amax = 0.f;
      for (int64_t i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(xg[i]));
      const float d = amax / 127.f;
      const float id = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      int8_t* qg = r.q.data() + m * K + g * QK;
      for (int64_t i = 0; i < QK; ++i) {
        const int q = static_cast<int>(std::nearbyint(xg[i] * id));
        qg[i] = static_cast<int8_t>(q);
        sum += q;
      }
      r.d[m * G + g] = d;
      r.s[m * G + g] = d * static_cast<float>(sum);
    }
  }
  return r;
}

// sum_g a[g] * b[g] for fp16 a, fp32 b: 8 groups per instruction.
inline float dot_fp16_fp32(const at::Half* a, const float* b, int64_t G) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) {
    const __m256 av = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + g)));
    acc = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + g), acc);
  }
  float tail = 0.f;
  for (; g < G; ++g) tail += fp16(a + g) * b[g];
  return hsum(acc) + tail;
}

inline __m256i unpack_q4(const uint8_t* p) {  // 16 bytes -> 32 values 0..15 in weight order
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}

inline __m256i dot_q8_q8_group(__m256i qw, __m256i qv) {
  // maddubs needs one unsigned operand: |w| . (x * sign(w)), as ggml does.
  return _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qv, qw));
}

// One output row . R quantized activation rows (R <= 4): each weight group is loaded and unpacked
// once for the R rows, which is what keeps a batched step (16 rows) from redoing the unpacking per
// row. R = 1 is dot_row below.
// NOTE: every row's float operations are dot_row's, in its order (group g on chain g mod 4, the chains
// summed pairwise at the end), so a row's result does not depend on how many rows share the call: an
// answer must not change with the other requests decoding beside it (batch invariance; tested). The
// chains run one after the other, as in dot_x4_q4, so R accumulators are live rather than 4 R.
template <int BITS>
inline void dot_row(const uint8_t* w, const at::Half* d, const int8_t* qx, const float* dx, int64_t G, float* out);

template <int BITS, int R>
inline void dot_rows(const uint8_t* w, const at::Half* d, const int8_t* qx, const float* dx, int64_t K,
                     int64_t G, float* out) {
  if constexpr (R == 1) {
    dot_row<BITS>(w, d, qx, dx, G, out);
    return;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 chains[4][R];
  for (int a = 0; a < 4; ++a) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = a; g < G; g += 4) {
      __m256i wu;  // the unsigned operand of maddubs
      __m256i ws = _mm256_setzero_si256();  // int8 only: the weights' signs, moved onto the activations
      if constexpr (BITS == 4) {
        wu = unpack_q4(w + g * 16);
      } else {
        ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * QK));
        wu = _mm256_sign_epi8(ws, ws);  // |w| . (x * sign(w)), as ggml does
      }
      const float dw = fp16(d + g);
      for (int r = 0; r < R; ++r) {
        __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * K + g * QK));
        if constexpr (BITS == 8) qv = _mm256_sign_epi8(qv, ws);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wu, qv), ones));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[r * G + g]), p, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) chains[a][r] = acc[r];
  }
  for (int r = 0; r < R; ++r) {
    out[r] = hsum(_mm256_add_ps(_mm256_add_ps(chains[0][r], chains[1][r]), _mm256_add_ps(chains[2][r], chains[3][r])));
  }
}

// dot_rows for one activation row (single-stream decode). Four accumulators, one per group mod 4:
// one FMA chain would leave the core waiting on its latency every group. The arithmetic is that of
// the earlier one-row loop (fma(dw * dx, p) into acc[g & 3]), so the bits are unchanged, with
// fewer instructions per group: the scale products are computed 8 at a time up front and the two
// nibble halves of an int4 group come from one 64-bit variable shift of a broadcast load. Measured on
// SmolLM2's gate_up (3072 x 576) streamed from DRAM: 0.27 -> 0.16 ms (AVX2 EPYC, one thread).
template <int BITS>
inline void dot_row(const uint8_t* w, const at::Half* d, const int8_t* qx, const float* dx, int64_t G, float* out) {
  constexpr int64_t CHUNK = 64;  // groups whose scale products sit on the stack at a time
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
  const __m256i shift = _mm256_setr_epi64x(0, 0, 4, 4);  // low nibbles into lane 0, high into lane 1
  alignas(32) float scale[CHUNK];
  __m256 acc[4];
  for (int a = 0; a < 4; ++a) acc[a] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += CHUNK) {
    const int64_t g1 = std::min(G, g0 + CHUNK);
    int64_t g = g0;
    for (; g + 8 <= g1; g += 8) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + g)));
      _mm256_store_ps(scale + (g - g0), _mm256_mul_ps(dw, _mm256_loadu_ps(dx + g)));
    }
    for (; g < g1; ++g) scale[g - g0] = fp16(d + g) * dx[g];
    for (g = g0; g < g1; ++g) {
      __m256i wu, qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + g * QK));
      if constexpr (BITS == 4) {
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g * 16)));
        wu = _mm256_and_si256(_mm256_srlv_epi64(b, shift), nibble);
      } else {
        const __m256i ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * QK));
        wu = _mm256_sign_epi8(ws, ws);
        qv = _mm256_sign_epi8(qv, ws);
      }
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wu, qv), ones));
      acc[g & 3] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + (g - g0)), p, acc[g & 3]);
    }
  }
  out[0] = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

// int8 weights . one fp32 activation row (not quantized): for the LM head, whose argmax flips on
// SmolLM2 when its input is rounded to int8 (measured), at ~2x the integer path's compute.
inline float dot_row_q8_f32(const int8_t* w, const at::Half* d, const float* x, int64_t G) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * QK));
    const __m128i lo = _mm256_castsi256_si128(qw), hi = _mm256_extracti128_si256(qw, 1);
    const float* xg = x + g * QK;
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(xg));
    t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(xg + 8), t);
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(xg + 16));
    u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(xg + 24), u);
    const __m256 scale = _mm256_set1_ps(fp16(d + g));
    acc0 = _mm256_fmadd_ps(scale, t, acc0);
    acc1 = _mm256_fmadd_ps(scale, u, acc1);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// dot_row_q8_f32 for R rows, each group's weights widened to fp32 once for the R rows; every row's float
// operations are dot_row_q8_f32's, in its order (products, then the scale), so the LM head's logits of a
// row do not depend on how many rows share the call (batch invariance; tested).
template <int R>
inline void dot_rows_q8_f32(const int8_t* w, const at::Half* d, const float* x, int64_t K, int64_t G, float* out) {
  if constexpr (R == 1) {
    out[0] = dot_row_q8_f32(w, d, x, G);
    return;
  }
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * QK));
    const __m128i lo = _mm256_castsi256_si128(qw), hi = _mm256_extracti128_si256(qw, 1);
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    const __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    const __m256 scale = _mm256_set1_ps(fp16(d + g));
    for (int r = 0; r < R; ++r) {
      const float* xg = x + r * K + g * QK;
      const __m256 t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xg + 8), _mm256_mul_ps(w0, _mm256_loadu_ps(xg)));
      const __m256 u = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), _mm256_mul_ps(w2, _mm256_loadu_ps(xg + 16)));
      acc0[r] = _mm256_fmadd_ps(scale, t, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(scale, u, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
}

}  // namespace lowbit
