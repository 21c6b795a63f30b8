// F.rms_norm of fp32 rows, the one expression every kernel here uses (the input norm fused into the
// low-bit linears, Gemma's output norms, the q/k norms of decode attention): x * rsqrt(mean(x^2) + eps)
// * w, summed in order (equal to torch's to ~1e-7, not bit for bit).
#pragma once

#include <cmath>
#include <cstdint>

// rsqrt(mean(x^2) + eps) of one row of n floats.
inline float rms_rstd(const float* x, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.f / std::sqrt(ss / n + eps);
}

// out = rms_norm(x) * w; `out` may be `x`.
inline void rms_norm_row(const float* x, const float* w, float eps, float* out, int64_t n) {
  const float rstd = rms_rstd(x, n, eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * rstd * w[i];
}
