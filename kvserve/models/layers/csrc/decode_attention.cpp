// Everything between qkv_proj and o_proj for a batch of one-token decodes, fp32, on the CPU:
// (for Qwen3 and Gemma 3) the per-head RMSNorm of q and k, RoPE of q and k, the KV write into the
// paged cache, and attention that reads the cache's blocks in place.
//
// Why: in torch this is ~15 ops per layer (rotary's cat/mul/add, two index_copy_, the gather or
// workspace bookkeeping, SDPA's own setup), ~0.3 ms per layer at one stream, more than the
// layer's low-bit GEMVs. One call per layer, parallel over (sequence, KV head).
//
// Layouts: qkv [B, (H + 2 KVH) * D]; cos/sin [B, D] (sin with its first half negated, as
// rotary.py builds it: rot(x) = x * cos + cat(x2, x1) * sin); cache [2, num_blocks, block_size,
// KVH, D]; slot_mapping [B]; block_tables [B, max_blocks]; seq_lens [B] (keys after this token);
// q_norm / k_norm [D] or None: the RMSNorm scales (Gemma's 1 + w already added by the caller).
#include "cpu_kernels.h"
#include "rms_norm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float tail = 0.f;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i < n; ++i) tail += a[i] * b[i];
  __m256 v = _mm256_add_ps(acc0, acc1);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x) + tail;
}

// A key's or value's row (D floats) into L1 ahead of its use. Why: the rows of one KV head are
// KVH * D floats apart and come from DRAM (a step's weights have evicted them), and without it the
// loads of the score and value loops were most of a step's attention time (perf, SmolLM2 decode).
// The arithmetic is untouched.
constexpr int64_t PREFETCH_ROWS = 8;

inline void prefetch_row(const float* row, int64_t D) {
  for (int64_t i = 0; i < D; i += 16) _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) out[i] = x[i] * cos[i] + x[i < half ? i + half : i - half] * sin[i];
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& cache, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                               int64_t num_heads, int64_t num_kv_heads, double scale, int64_t window,
                               const c10::optional<torch::Tensor>& q_norm,
                               const c10::optional<torch::Tensor>& k_norm, double norm_eps) {
  const int64_t B = qkv.size(0), H = num_heads, KVH = num_kv_heads;
  TORCH_CHECK(cache.dim() == 5 && cache.scalar_type() == torch::kFloat32 && cache.is_contiguous(), "cache");
  const int64_t block_size = cache.size(2), D = cache.size(4);
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat32 && qkv.is_contiguous() && qkv.size(1) == (H + 2 * KVH) * D);
  TORCH_CHECK(H % KVH == 0 && cache.size(3) == KVH && D % 2 == 0);
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == B * D && sin.numel() == B * D);
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32);
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && block_tables.scalar_type() == torch::kInt64 &&
              seq_lens.scalar_type() == torch::kInt64 && block_tables.is_contiguous() &&
              slot_mapping.numel() == B && seq_lens.numel() == B && block_tables.size(0) == B);
  auto norm_scale = [&](const c10::optional<torch::Tensor>& w) -> const float* {
    if (!w.has_value()) return nullptr;
    TORCH_CHECK(w->scalar_type() == torch::kFloat32 && w->is_contiguous() && w->numel() == D, "q/k norm: fp32 [D]");
    return w->data_ptr<float>();
  };
  const float* qn = norm_scale(q_norm);
  const float* kn = norm_scale(k_norm);
  const int64_t group = H / KVH, max_blocks = block_tables.size(1);
  const int64_t kv_stride = cache.size(1) * block_size * KVH * D;  // K plane -> V plane
  const float* x = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* kv = cache.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  auto q = torch::empty({B, H, D}, qkv.options());
  float* qr = q.data_ptr<float>();
  std::vector<float> normed(D);
  auto head = [&](const float* in, const float* norm) -> const float* {  // q or k head before RoPE
    if (norm == nullptr) return in;
    rms_norm_row(in, norm, static_cast<float>(norm_eps), normed.data(), D);
    return normed.data();
  };
  for (int64_t b = 0; b < B; ++b) {  // (q/k norm,) RoPE and the KV write: tiny, serial
    const float* row = x + b * (H + 2 * KVH) * D;
    for (int64_t h = 0; h < H; ++h) rope(head(row + h * D, qn), c + b * D, s + b * D, qr + (b * H + h) * D, D);
    float* k_slot = kv + slots[b] * KVH * D;
    for (int64_t h = 0; h < KVH; ++h) rope(head(row + (H + h) * D, kn), c + b * D, s + b * D, k_slot + h * D, D);
    std::copy(row + (H + KVH) * D, row + (H + 2 * KVH) * D, k_slot + kv_stride);
  }
  auto out = torch::empty({B, H * D}, qkv.options());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KVH, kvh = task % KVH, len = lens[b];
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - start;
      float* og = o + (b * H + kvh * group) * D;
      std::fill(og, og + group * D, 0.f);
      if (n <= 0) continue;  // NOTE: a decode always sees its own key; kept safe anyway
      scores.assign(group * n, 0.f);
      auto key_at = [&](int64_t t) {  // the cache row of key t of this sequence, in place
        const int64_t block = tables[b * max_blocks + t / block_size];
        return kv + ((block * block_size + t % block_size) * KVH + kvh) * D;
      };
      for (int64_t t = 0; t < PREFETCH_ROWS && t < n; ++t) prefetch_row(key_at(start + t), D);
      for (int64_t t = 0; t < n; ++t) {
        if (t + PREFETCH_ROWS < n) prefetch_row(key_at(start + t + PREFETCH_ROWS), D);
        const float* k = key_at(start + t);
        for (int64_t g = 0; g < group; ++g) scores[g * n + t] = dot(qr + (b * H + kvh * group + g) * D, k, D) * scale;
      }
      for (int64_t g = 0; g < group; ++g) {  // softmax
        float* sg = scores.data() + g * n;
        const float mx = *std::max_element(sg, sg + n);
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) sum += (sg[t] = std::exp(sg[t] - mx));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < n; ++t) sg[t] *= inv;
      }
      for (int64_t t = 0; t < PREFETCH_ROWS && t < n; ++t) prefetch_row(key_at(start + t) + kv_stride, D);
      for (int64_t t = 0; t < n; ++t) {
        if (t + PREFETCH_ROWS < n) prefetch_row(key_at(start + t + PREFETCH_ROWS) + kv_stride, D);
        const float* v = key_at(start + t) + kv_stride;
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * n + t];
          float* out_g = og + g * D;
          for (int64_t d = 0; d < D; ++d) out_g[d] += p * v[d];
        }
      }
    }
  });
  return out;
}
