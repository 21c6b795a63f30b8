// Low-bit weight-only GEMV/GEMM for small batches on AVX2 CPUs, fp32 activations.
//
// Why: a decode step reads every weight once, so it is bound by DRAM bandwidth; torch's own
// int4/int8 weight-only CPU kernels are fast only with AVX512 (on AVX2 they are slower than the
// dense fp32 GEMV). The scheme is ggml's Q4_1 x Q8_1 / Q8_0 x Q8_0: weights in groups of 32 with
// fp16 scales, the activation row quantized to int8 per group of 32 inside the call, and the
// group dot products done in integers (vpmaddubsw). Prologue and epilogues of a decoder layer
// are fused in: RMSNorm of the input, bias, residual add, SiLU(gate) * up (or Gemma's
// GELU-tanh(gate) * up) of a [gate | up] weight, and Gemma's RMSNorm of the output before the
// residual add (post_norm).
//
// Formats (built by ../lowbit_cpu.py, which also holds the torch reference of this math):
//   int4: qweight uint8 [N, K/2]; byte j of group g holds weight 32g+j (low nibble) and 32g+j+16
//         (high nibble), values 0..15; scales fp16 [N, 2, K/32] = (d, m): w = q * d + m.
//   int8: qweight int8 [N, K], values -127..127; scales fp16 [N, K/32]: w = q * d.
//   packed (optional): the same weights in lowbit_x4.h's layout, which one-row-at-a-time calls of int4
//         (and of int8 on fp32 input: the LM head) read instead; the others keep the row layout.
#include "cpu_kernels.h"
#include "lowbit_dot.h"
#include "lowbit_x4.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace lowbit;

namespace {

constexpr int ROW_BLOCK = 4;

enum Act : int64_t { SILU = 0, GELU_TANH = 1 };

// act(gate) * up. SiLU is written as it always was here (the SmolLM2/Qwen logits stay the same
// bits); GELU-tanh is torch's F.gelu(approximate="tanh").
inline float gate_act(float g, float u, int64_t act) {
  if (act == SILU) return g / (1.f + std::exp(-g)) * u;
  const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // sqrt(2 / pi)
  return 0.5f * g * (1.f + std::tanh(inner)) * u;
}

// y[m] = res[m] + rms_norm(y[m]) * w (Gemma's norm of a projection's output before the residual add).
void post_norm_rows(float* y, const float* w, float eps, const float* res, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; ++m) {
    float* ym = y + m * N;
    const float rstd = rms_rstd(ym, N, eps);
    for (int64_t n = 0; n < N; ++n) {  // one expression with the residual add (the compiler fuses it)
      const float v = ym[n] * rstd * w[n];
      ym[n] = res != nullptr ? v + res[m * N + n] : v;
    }
  }
}

// Whether `packed` (lowbit_x4.h) serves this call: one activation row (with more, the row layout's
// kernel unpacks each weight group once for 4 rows, and was 12-15% faster at 2-8 rows, measured), int4
// on quantized activations or int8 on fp32 ones, and a gated weight's up half on a block of 4 rows.
bool use_x4(const c10::optional<torch::Tensor>& packed, int64_t M, int64_t bits, bool quantize_x, bool gated,
            int64_t N, int64_t G) {
  if (!packed.has_value() || M != 1 || (bits == 4) != quantize_x || (gated && (N / 2) % 4 != 0)) return false;
  TORCH_CHECK(packed->dim() == 2 && packed->is_contiguous() && packed->scalar_type() == torch::kUInt8 &&
                  packed->size(0) == (N + 3) / 4 && packed->size(1) == G * (bits == 4 ? X4_Q4_BYTES : X4_Q8_BYTES),
              "packed: uint8 [ceil(N/4), 80 G (int4) or 136 G (int8)]");
  return true;
}

// The x4 layout's loop: each block of 4 output rows for every activation row in turn, so the block's
// bytes come from DRAM once and from L1 for the other rows (a block is G * 80 bytes: 1.4 KB at K = 576).
void linear_x4(const uint8_t* packed, int64_t bits, const QuantRows& xq, const float* xf, int64_t M, int64_t K,
               int64_t N, int64_t N_out, const float* b, const float* res, bool gated, int64_t act, float* y) {
  const int64_t G = K / QK, block_bytes = G * (bits == 4 ? X4_Q4_BYTES : X4_Q8_BYTES);
  auto dot4 = [&](int64_t block, int64_t m, float* v) {  // rows 4 * block + [0, 4) for activation row m
    const uint8_t* blk = packed + block * block_bytes;
    if (bits == 4 && m == 0) prefetch_block(blk + block_bytes, block_bytes);  // past the end: harmless
    if (bits == 4) {
      dot_x4_q4(blk, xq.q.data() + m * K, xq.d.data() + m * G, xq.s.data() + m * G, G, v);
    } else {
      dot_x4_q8_f32(blk, xf + m * K, G, v);
    }
    for (int i = 0; b != nullptr && i < 4 && 4 * block + i < N; ++i) v[i] += b[4 * block + i];
  };
  at::parallel_for(0, (N_out + 3) / 4, 4, [&](int64_t begin, int64_t end) {
    float gv[4], uv[4];
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t m = 0; m < M; ++m) {
        dot4(block, m, gv);
        if (gated) {
          dot4(block + N_out / 4, m, uv);
          for (int i = 0; i < 4; ++i) gv[i] = gate_act(gv[i], uv[i], act);
        }
        for (int i = 0; i < 4 && 4 * block + i < N_out; ++i) {
          const int64_t at = m * N_out + 4 * block + i;
          y[at] = res != nullptr ? gv[i] + res[at] : gv[i];
        }
      }
    }
  });
}

}  // namespace

// y = act(x' @ W^T + bias) + residual, x' = rms_norm(x) when norm_weight is given.
// gated: W is [gate | up] with N = 2I rows and y[:, i] = act(gate_i) * up_i, shape [M, I]
// (act: 0 SiLU, 1 GELU-tanh). post_norm: y = rms_norm(x' @ W^T + bias) * post_norm + residual.
torch::Tensor lowbit_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                            int64_t bits, const c10::optional<torch::Tensor>& bias,
                            const c10::optional<torch::Tensor>& residual,
                            const c10::optional<torch::Tensor>& norm_weight, double eps, bool gated,
                            bool quantize_x, const c10::optional<torch::Tensor>& packed, int64_t act,
                            const c10::optional<torch::Tensor>& post_norm, double post_eps) {
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
  TORCH_CHECK(act == SILU || act == GELU_TANH, "act: 0 (SiLU) or 1 (GELU-tanh)");
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const float* res = nullptr;
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == torch::kFloat32 && residual->is_contiguous() &&
                residual->size(0) == M && residual->size(1) == N_out, "residual: contiguous fp32 [M, N_out]");
    res = residual->data_ptr<float>();
  }
  const float* post = nullptr;
  if (post_norm.has_value()) {
    TORCH_CHECK(post_norm->scalar_type() == torch::kFloat32 && post_norm->is_contiguous() &&
                post_norm->numel() == N_out, "post_norm: contiguous fp32 [N_out]");
    post = post_norm->data_ptr<float>();
  }
  const float* row_res = post != nullptr ? nullptr : res;  // with post_norm, the residual comes after it
  const float* xf = x.data_ptr<float>();
  const QuantRows xq = quantize_x ? quantize_rows(xf, M, K, norm, static_cast<float>(eps)) : QuantRows{};
  auto out = torch::empty({M, N_out}, x.options());
  float* y = out.data_ptr<float>();
  if (use_x4(packed, M, bits, quantize_x, gated, N, G)) {
    linear_x4(packed->data_ptr<uint8_t>(), bits, xq, xf, M, K, N, N_out, b, row_res, gated, act, y);
    if (post != nullptr) post_norm_rows(y, post, static_cast<float>(post_eps), res, M, N_out);
    return out;
  }
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
          for (int i = 0; i < r; ++i) gv[i] = gate_act(gv[i], uv[i], act);
        }
        for (int i = 0; i < r; ++i) {
          const int64_t at = (m + i) * N_out + n;
          y[at] = row_res != nullptr ? gv[i] + row_res[at] : gv[i];
        }
      }
    }
  });
  if (post != nullptr) post_norm_rows(y, post, static_cast<float>(post_eps), res, M, N_out);
  return out;
}
