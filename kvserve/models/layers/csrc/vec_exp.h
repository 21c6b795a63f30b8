// exp(x) for x <= 0 on AVX2, shared by the attention kernels (one definition, the same bits in both).
#pragma once

#include <immintrin.h>

// exp(x) for x <= 0 (scores minus their maximum), 8 at a time: x = n ln2 + r with |r| <= ln2 / 2,
// exp(r) by Cephes' degree-6 expf polynomial (about 1 ulp), 2^n through the exponent bits. Why: a
// scalar std::exp per score (SmolLM2 at 7K context takes 1.9M per step) was ~4% of such a step,
// measured when this replaced it; the keys' DRAM reads are most of the rest. Clamped at -87 so that 2^n stays a normal float (exp(-87) ~ 1.6e-38;
// a probability that small adds nothing to a sum that holds a 1).
inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts (Cody-Waite)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2n));
}

// The same for one float (a row's tail), lane 0 of the vector version: the same bits.
inline float exp_neg(float x) { return _mm_cvtss_f32(_mm256_castps256_ps128(exp_neg(_mm256_set1_ps(x)))); }
