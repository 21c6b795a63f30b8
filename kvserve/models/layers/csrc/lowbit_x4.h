// The one-row GEMVs of single-stream decode on the "x4" layout (lowbit_cpu.pack_for_decode): blocks of 4 output
// rows, each block one contiguous run of bytes, the groups' scales beside their quants:
//   int4: [ceil(N/4), 80 G] = per group of 32, d[4] (fp16) then the 4 rows' 16 bytes of nibbles
//         (Q4_1 order): 72 G bytes; then the mins m[4][G] (fp16, row-major): 8 G bytes
//   int8: [ceil(N/4), 136 G] = per group, d[4] (fp16) then the 4 rows' 32 int8 quants (the LM head)
//
// Why: SmolLM2's rows are short (K = 576: 288 bytes of int4), so the row-by-row kernel paid its
// per-row set-up, reduction and separate min pass every 18 groups, and read weights and scales as
// separate streams. Four rows per pass share the activation loads and keep independent FMA chains in
// flight, and the next block is prefetched while this one is computed. In one process at SmolLM2's
// shapes (scripts/cpu_lowbit_ab.py, one thread, AVX2 EPYC): 30 layers' GEMVs (66 MB) 9.8 -> 7.9 ms,
// the LM head 3.5 -> 2.9 ms; see docs/benchmarks/history.md.
//
// NOTE: each row's float operations are the row layout's (dot_row, dot_fp16_fp32, dot_row_q8_f32), in
// the same order, so the logits are bit for bit equal (tested) and greedy answers cannot move with the
// layout. (One FMA chain per row with the mins folded in was ~10% faster standalone, but reassociates.)
#pragma once

#include "lowbit_dot.h"

namespace lowbit {

constexpr int64_t X4_Q4_BYTES = 80, X4_Q8_BYTES = 136;  // a block's bytes per group

// The next block into L1 while this one is computed (the 4-pass loop below reads a block strided).
inline void prefetch_block(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(p + at), _MM_HINT_T0);
}

// Rows 4b..4b+3 . one activation row quantized per group (qx [K], dx and sx = dx * sum(qx) [G]).
// w = q * d + m: d * dx * dot(q, qx) per group on 4 FMA chains per row (group g on chain g mod 4,
// as dot_row), then the mins' m . sx (dot_fp16_fp32). The chains are run one after the other, each
// for all 4 rows: 4 accumulators live instead of 16.
inline void dot_x4_q4(const uint8_t* blk, const int8_t* qx, const float* dx, const float* sx, int64_t G,
                      float* out) {
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
  const __m256i shift = _mm256_setr_epi64x(0, 0, 4, 4);  // low nibbles into lane 0, high into lane 1
  __m256 chains[4][4];  // [chain][row]
  for (int a = 0; a < 4; ++a) {
    __m256 acc[4];
    for (int r = 0; r < 4; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = a; g < G; g += 4) {
      const uint8_t* grp = blk + g * 72;
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + g * QK));
      alignas(16) float scale[4];
      _mm_store_ps(scale, _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(grp))),
                                     _mm_set1_ps(dx[g])));
      for (int r = 0; r < 4; ++r) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 8 + 16 * r));
        const __m256i wu = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastsi128_si256(q), shift), nibble);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wu, qv), ones));
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + r), p, acc[r]);
      }
    }
    for (int r = 0; r < 4; ++r) chains[a][r] = acc[r];
  }
  const auto* mins = reinterpret_cast<const at::Half*>(blk + 72 * G);  // [4, G]
  for (int r = 0; r < 4; ++r) {
    out[r] = hsum(_mm256_add_ps(_mm256_add_ps(chains[0][r], chains[1][r]), _mm256_add_ps(chains[2][r], chains[3][r])));
    out[r] += dot_fp16_fp32(mins + r * G, sx, G);
  }
}

// Rows 4b..4b+3 (int8) . one fp32 activation row: each row's arithmetic is dot_row_q8_f32's, in the
// same order, so the LM head's logits are bit for bit the row layout's (tested).
// The stream is prefetched 2 KB ahead and a group's 4 scales are converted in one instruction: on
// Gemma 3's head (262,144 x 640, 178 MB) 13.0 -> 10.5 ms standalone, one thread (512 bytes ahead and
// a conversion per row otherwise; docs/benchmarks/history.md).
constexpr int X4_Q8_PREFETCH = 2048;

inline void dot_x4_q8_f32(const uint8_t* blk, const float* x, int64_t G, float* out) {
  __m256 acc0[4], acc1[4];
  for (int r = 0; r < 4; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g, blk += X4_Q8_BYTES) {
    for (int at = X4_Q8_PREFETCH; at < X4_Q8_PREFETCH + 192; at += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(blk) + at, _MM_HINT_T0);  // past the end: harmless
    }
    const float* xg = x + g * QK;
    const __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
    const __m256 x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
    const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk)));  // the 4 rows' d
    const __m256 d8 = _mm256_set_m128(d4, d4);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* q = blk + 8 + 32 * r;
      auto widen = [q](int at) {  // 8 int8 -> 8 fp32, the load folded into the conversion
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + at))));
      };
      __m256 t = _mm256_mul_ps(widen(0), x0);
      t = _mm256_fmadd_ps(widen(8), x1, t);
      __m256 u = _mm256_mul_ps(widen(16), x2);
      u = _mm256_fmadd_ps(widen(24), x3, u);
      const __m256 scale = _mm256_permutevar_ps(d8, _mm256_set1_epi32(r));  // fp16(d + r), exact either way
      acc0[r] = _mm256_fmadd_ps(scale, t, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(scale, u, acc1[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
}

}  // namespace lowbit
