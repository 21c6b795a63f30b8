// The prefill GEMM of the int4 weights: Q4_1 weights x activations rounded to int8 per group of 32
// (the decode kernel's math, lowbit_dot.h), for many rows at once, on AVX2.
//
// Why: prefill ran the dense fp32 weights (SGEMM: 8 multiply-adds per FMA, two FMAs a cycle). Here
// the products are vpmaddubsw (32 u8 x s8 multiply-adds into 16 int16 pair sums): the int4 weights
// (0..15) times int8 activations (|q| <= 127) give pairs of at most 3,810, so the 8 steps of a
// group of 32 are summed in int16 (<= 30,480) and widened once per group. The weights are repacked
// once (lowbit_cpu.pack_for_gemm) into blocks of 8 output rows so that a vector holds 8 columns x 4
// k (the activation's 4 bytes are broadcast); scales and mins as fp32 vectors of the 8 columns:
//   qweight uint8 [N/8, G, 4, 32]: byte 4i+t of vector j = column i, k = 32g+4j+t (low nibble) and
//                                  k = 32g+4j+16+t (high nibble);
//   scales float [N/8, G, 2, 8]: (d, m) of the 8 columns: w = q * d + m.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace lowbit {

// Rows [m0, m0 + R) x columns [8b, 8b + 8): y[r][i] = sum_g d[i] dx[r] S[r][i] + m[i] sx[r].
// qx [M, K] int8, dx/sx [M, G] (scale, scale * sum of the group's q).
template <int R>
inline void gemm_tile_q4(const uint8_t* wb, const float* sb, const int8_t* qx, const float* dx, const float* sx,
                         int64_t K, int64_t G, __m256 out[R]) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    const uint8_t* wg = wb + g * 128;
    const int8_t* xg = qx + g * 32;
    for (int j = 0; j < 4; ++j) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + j * 32));
      const __m256i lo = _mm256_and_si256(wv, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nibble);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xg + r * K + 4 * j;
        const __m256i xl = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x));
        const __m256i xh = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x + 16));
        sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(lo, xl));
        sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(hi, xh));
      }
    }
    const __m256 d = _mm256_loadu_ps(sb + g * 16), m = _mm256_loadu_ps(sb + g * 16 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum[r], ones));
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx[r * G + g])), s, acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[r * G + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

}  // namespace lowbit
