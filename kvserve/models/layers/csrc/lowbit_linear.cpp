// Low-bit weight-only GEMV/GEMM for small batches on AVX2 CPUs, fp32 activations.
//
// Why: a decode step reads every weight once, so it is bound by DRAM bandwidth; torch's own
// int4/int8 weight-only CPU kernels are fast only with AVX512 (on AVX2 they are slower than the
// dense fp32 GEMV). The scheme is ggml's Q4_1 x Q8_1 / Q8_0 x Q8_0: weights in groups of 32 with
// fp16 scales, the activation row quantized to int8 per group of 32 inside the call, and the
// group dot products done in integers (vpmaddubsw). Prologue and epilogues of a decoder layer
// are fused in: RMSNorm of the input, bias, residual add, SiLU(gate) * up of a [gate | up] weight.
//
// Formats (built by ../lowbit_cpu.py, which also holds the torch reference of this math):
//   int4: qweight uint8 [N, K/2]; byte j of group g holds weight 32g+j (low nibble) and 32g+j+16
//         (high nibble), values 0..15; scales fp16 [N, 2, K/32] = (d, m): w = q * d + m.
//   int8: qweight int8 [N, K], values -127..127; scales fp16 [N, K/32]: w = q * d.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t QK = 32;

struct QuantRows {  // activation rows quantized per group of 32
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, G] scale
  std::vector<float> s;    // [M, G] d * sum(q): the group sum, for int4's min term
};

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float fp16(const at::Half* p) { return _cvtsh_ss(reinterpret_cast<const uint16_t&>(*p)); }

// x [M, K] (optionally RMS-normalized with weight `norm`) -> int8 groups of 32.
QuantRows quantize_rows(const float* x, int64_t M, int64_t K, const float* norm, float eps) {
  const int64_t G = K / QK;
  QuantRows r{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(M * G)};
  std::vector<float> row(K);
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    if (norm != nullptr) {  // F.rms_norm in fp32: x * rsqrt(mean(x^2) + eps) * w
      float ss = 0.f;
      for (int64_t k = 0; k < K; ++k) ss += xm[k] * xm[k];
      const float rstd = 1.f / std::sqrt(ss / K + eps);
      for (int64_t k = 0; k < K; ++k) row[k] = xm[k] * rstd * norm[k];
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
// row. With R = 1, four accumulators: one FMA chain would leave the core waiting on its latency
// every group (groups are only ~6 instructions); with R > 1 the rows are the independent chains.
template <int BITS, int R>
inline void dot_rows(const uint8_t* w, const at::Half* d, const int8_t* qx, const float* dx, int64_t K,
                     int64_t G, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int A = R == 1 ? 4 : R;
  __m256 acc[A];
  for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
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
      const int a = R == 1 ? static_cast<int>(g & 3) : r;
      acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[r * G + g]), p, acc[a]);
    }
  }
  if constexpr (R == 1) {
    out[0] = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  } else {
    for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
  }
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

// The same for R > 1 rows: each group's weights are widened to fp32 and scaled once for the R rows
// (one row keeps dot_row_q8_f32, which scales after the products: fewer instructions for one row).
template <int R>
inline void dot_rows_q8_f32(const int8_t* w, const at::Half* d, const float* x, int64_t K, int64_t G,
                            float* out) {
  if constexpr (R == 1) {
    out[0] = dot_row_q8_f32(w, d, x, G);
    return;
  }
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * QK));
    const __m128i lo = _mm256_castsi256_si128(qw), hi = _mm256_extracti128_si256(qw, 1);
    const __m256 scale = _mm256_set1_ps(fp16(d + g));
    const __m256 w0 = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    const __m256 w1 = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    const __m256 w2 = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    const __m256 w3 = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    for (int r = 0; r < R; ++r) {
      const float* xg = x + r * K + g * QK;
      acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xg), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xg + 8), acc[r][1]);
      acc[r][0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xg + 16), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

constexpr int ROW_BLOCK = 4;

}  // namespace

// y = act(x' @ W^T + bias) + residual, x' = rms_norm(x) when norm_weight is given.
// gated: W is [gate | up] with N = 2I rows and y[:, i] = silu(gate_i) * up_i, shape [M, I].
torch::Tensor lowbit_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                            int64_t bits, const c10::optional<torch::Tensor>& bias,
                            const c10::optional<torch::Tensor>& residual,
                            const c10::optional<torch::Tensor>& norm_weight, double eps, bool gated,
                            bool quantize_x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous fp32 [M, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0), G = K / QK;
  TORCH_CHECK(K % QK == 0 && scales.size(0) == N && scales.size(-1) == G, "shape mismatch");
  TORCH_CHECK(qweight.size(1) == (bits == 4 ? K / 2 : K) && qweight.is_contiguous() && scales.is_contiguous());
  TORCH_CHECK(!gated || N % 2 == 0, "gated needs an even N");
  TORCH_CHECK(quantize_x || (bits == 8 && !norm_weight.has_value()), "fp32 x: int8 weights, no norm");
  const int64_t N_out = gated ? N / 2 : N;
  const float* norm = nullptr;
  if (norm_weight.has_value()) {
    TORCH_CHECK(norm_weight->scalar_type() == torch::kFloat32 && norm_weight->numel() == K);
    norm = norm_weight->data_ptr<float>();
  }
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const float* res = nullptr;
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == torch::kFloat32 && residual->is_contiguous() &&
                residual->size(0) == M && residual->size(1) == N_out, "residual: contiguous fp32 [M, N_out]");
    res = residual->data_ptr<float>();
  }
  const float* xf = x.data_ptr<float>();
  const QuantRows xq = quantize_x ? quantize_rows(xf, M, K, norm, static_cast<float>(eps)) : QuantRows{};
  auto out = torch::empty({M, N_out}, x.options());
  float* y = out.data_ptr<float>();
  const at::Half* sc = scales.data_ptr<at::Half>();
  const int64_t sc_row = bits == 4 ? 2 * G : G;
  const int64_t w_row = bits == 4 ? K / 2 : K;
  const auto* wbase = static_cast<const uint8_t*>(qweight.data_ptr());
  // Output row n for activation rows [m, m + r) into v[0..r).
  auto dot = [&](int64_t n, int64_t m, int r, float* v) {
    const uint8_t* w = wbase + n * w_row;
    const at::Half* d = sc + n * sc_row;
    if (!quantize_x) {
      const auto* w8 = reinterpret_cast<const int8_t*>(w);
      const float* xm = xf + m * K;
      switch (r) {
        case 1: dot_rows_q8_f32<1>(w8, d, xm, K, G, v); break;
        case 2: dot_rows_q8_f32<2>(w8, d, xm, K, G, v); break;
        case 3: dot_rows_q8_f32<3>(w8, d, xm, K, G, v); break;
        default: dot_rows_q8_f32<4>(w8, d, xm, K, G, v); break;
      }
    } else {
      const int8_t* qx = xq.q.data() + m * K;
      const float* dx = xq.d.data() + m * G;
      if (bits == 4) {
        switch (r) {
          case 1: dot_rows<4, 1>(w, d, qx, dx, K, G, v); break;
          case 2: dot_rows<4, 2>(w, d, qx, dx, K, G, v); break;
          case 3: dot_rows<4, 3>(w, d, qx, dx, K, G, v); break;
          default: dot_rows<4, 4>(w, d, qx, dx, K, G, v); break;
        }
        // int4: w = q * d + m, so the min adds m[g] * sum(x in group g) per group.
        for (int i = 0; i < r; ++i) v[i] += dot_fp16_fp32(d + G, xq.s.data() + (m + i) * G, G);
      } else {
        switch (r) {
          case 1: dot_rows<8, 1>(w, d, qx, dx, K, G, v); break;
          case 2: dot_rows<8, 2>(w, d, qx, dx, K, G, v); break;
          case 3: dot_rows<8, 3>(w, d, qx, dx, K, G, v); break;
          default: dot_rows<8, 4>(w, d, qx, dx, K, G, v); break;
        }
      }
    }
    if (b != nullptr) {
      for (int i = 0; i < r; ++i) v[i] += b[n];
    }
  };
  at::parallel_for(0, N_out, 16, [&](int64_t begin, int64_t end) {
    float gv[ROW_BLOCK], uv[ROW_BLOCK];
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m = 0; m < M; m += ROW_BLOCK) {
        const int r = static_cast<int>(std::min<int64_t>(ROW_BLOCK, M - m));
        dot(n, m, r, gv);
        if (gated) {
          dot(n + N_out, m, r, uv);
          for (int i = 0; i < r; ++i) gv[i] = gv[i] / (1.f + std::exp(-gv[i])) * uv[i];
        }
        for (int i = 0; i < r; ++i) {
          const int64_t at = (m + i) * N_out + n;
          y[at] = res != nullptr ? gv[i] + res[at] : gv[i];
        }
      }
    }
  });
  return out;
}
