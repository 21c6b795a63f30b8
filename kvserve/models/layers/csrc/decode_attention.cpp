// Everything between qkv_proj and o_proj for a batch of one-token decodes, fp32, on the CPU:
// (for Qwen3 and Gemma 3) the per-head RMSNorm of q and k, RoPE of q and k, the KV write into the
// paged cache, and attention that reads the cache's blocks in place.
//
// Why: in torch this is ~15 ops per layer (rotary's cat/mul/add, two index_copy_, the gather or
// workspace bookkeeping, SDPA's own setup), ~0.3 ms per layer at one stream, more than the
// layer's low-bit GEMVs. One call per layer, parallel over (sequence, chunk of keys).
//
// Layouts: qkv [B, (H + 2 KVH) * D]; cos/sin [B, D] (sin with its first half negated, as
// rotary.py builds it: rot(x) = x * cos + cat(x2, x1) * sin); cache [2, num_blocks, block_size,
// KVH, D], fp32 or fp16 (the CPU default for fp32 engines: half the bytes a long-context step
// reads; loaded with F16C, written rounded to nearest and saturated at fp16's range, as
// attention/torch_ref.py's write does); slot_mapping [B]; block_tables [B, max_blocks]; seq_lens
// [B] (keys after this token); q_norm / k_norm [D] or None: the RMSNorm scales (Gemma's 1 + w
// already added by the caller).
#include "cpu_kernels.h"
#include "hreduce.h"
#include "vec_exp.h"
#include "rms_norm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// The cache's element types: fp32, or fp16 kept as its bits (uint16_t). load8/load1 widen to fp32;
// store_row narrows a row computed in fp32.
using half_bits = uint16_t;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const half_bits* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float load1(const float* p) { return *p; }
inline float load1(const half_bits* p) { return _cvtsh_ss(*p); }

constexpr float FP16_MAX = 65504.f;

inline void store_row(const float* src, float* dst, int64_t n) { std::copy(src, src + n, dst); }
inline void store_row(const float* src, half_bits* dst, int64_t n) {
  int64_t i = 0;
  const __m256 hi = _mm256_set1_ps(FP16_MAX), lo = _mm256_set1_ps(-FP16_MAX);
  for (; i + 8 <= n; i += 8) {
    // Operands in this order so that a NaN passes through (max/min return their second on NaN),
    // as torch's clamp does on the torch paths' write.
    const __m256 x = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = _cvtss_sh(std::min(std::max(src[i], -FP16_MAX), FP16_MAX), _MM_FROUND_TO_NEAREST_INT);
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  int64_t i = 0;
  float tail = 0.f;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), acc1);
  }
  for (; i < n; ++i) tail += a[i] * load1(b + i);
  return hsum(_mm256_add_ps(acc0, acc1)) + tail;
}

// exp(s[t] - max) in place over n scores; returns their sum and sets *max_out (the softmax without
// its division: a chunk's sums are merged with the other chunks' first).
inline float exponentiate(float* s, int64_t n, float* max_out) {
  int64_t t = 0;
  __m256 mx8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; t + 8 <= n; t += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(s + t));
  float mx = hmax(mx8);
  for (; t < n; ++t) mx = std::max(mx, s[t]);
  const __m256 m = _mm256_set1_ps(mx);
  __m256 sum8 = _mm256_setzero_ps();
  float tail = 0.f;
  for (t = 0; t + 8 <= n; t += 8) {
    const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  for (; t < n; ++t) tail += (s[t] = exp_neg(s[t] - mx));
  *max_out = mx;
  return hsum(sum8) + tail;
}

// The 8 dot products q . k[j] (D floats each, D a multiple of 8), as one vector. Why: one dot
// product's horizontal sum takes about as many instructions as its 8 FMAs at D = 64; summing 8 at
// once (a transpose by hadd) takes about a quarter of that per key.
template <typename T>
inline __m256 dot8(const float* q, const T* const* k, int64_t D) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qi = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qi, load8(k[j] + i), a[j]);
  }
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// A key's or value's row (D floats) into L1 ahead of its use: the rows come from DRAM (a step's
// weights have evicted them). With rows read in cache order (below) the prefetches gain little
// (perf at 7K context: the loads still wait on DRAM; prefetcht0/t1/t2/nta and distances 8-64 rows
// within 5%); at long context the kernel stays bound by DRAM latency, at ~3x the bytes' time.
constexpr int64_t PREFETCH_ROWS = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < D * static_cast<int64_t>(sizeof(T)); i += 64) _mm_prefetch(bytes + i, _MM_HINT_T0);
}

inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) out[i] = x[i] * cos[i] + x[i < half ? i + half : i - half] * sin[i];
}

// Scores of `heads_kv` KV heads' query groups against keys rows[0..n) (each row: the task's heads
// side by side, heads_kv * D floats), times `scale`, into scores [heads_kv * group][n].
template <typename T>
void scores_of(const float* q, const T* const* rows, int64_t n, int64_t heads_kv, int64_t group, int64_t D,
               float scale, float* scores) {
  const int64_t span = heads_kv * D;
  for (int64_t t = 0; t < std::min(n, PREFETCH_ROWS); ++t) prefetch_row(rows[t], span);
  int64_t t = 0;
  if (D % 8 == 0) {
    const __m256 scale8 = _mm256_set1_ps(scale);
    for (; t + 8 <= n; t += 8) {  // 8 keys at a time
      for (int64_t kvh = 0; kvh < heads_kv; ++kvh) {
        // Head kvh's rows of the 8 keys PREFETCH_ROWS ahead, spread between the dot products.
        for (int j = 0; j < 8; ++j)
          if (t + j + PREFETCH_ROWS < n) prefetch_row(rows[t + j + PREFETCH_ROWS] + kvh * D, D);
        const T* k[8];
        for (int j = 0; j < 8; ++j) k[j] = rows[t + j] + kvh * D;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          _mm256_storeu_ps(scores + h * n + t, _mm256_mul_ps(dot8(q + h * D, k, D), scale8));
        }
      }
    }
  }
  for (; t < n; ++t) {
    if (t + PREFETCH_ROWS < n) prefetch_row(rows[t + PREFETCH_ROWS], span);
    for (int64_t h = 0; h < heads_kv * group; ++h) scores[h * n + t] = dot(q + h * D, rows[t] + (h / group) * D, D) * scale;
  }
}

// out[g][d0 .. d0 + 16) += sum over t of p[g * n + t] * v_t[d0 ..], for G query heads of one KV
// head: the G x 16 sums stay in registers over the keys (the compiler's loop loaded and stored
// them for every key).
template <int G, typename T>
inline void pv16(const float* p, int64_t n, const T* const* rows, int64_t t0, int64_t t1, int64_t offset,
                 float* out, int64_t D) {
  __m256 a[G][2];
  for (int g = 0; g < G; ++g) {
    a[g][0] = _mm256_loadu_ps(out + g * D);
    a[g][1] = _mm256_loadu_ps(out + g * D + 8);
  }
  for (int64_t t = t0; t < t1; ++t) {
    const T* v = rows[t] + offset;
    const __m256 v0 = load8(v), v1 = load8(v + 8);
    for (int g = 0; g < G; ++g) {
      const __m256 pg = _mm256_broadcast_ss(p + g * n + t);
      a[g][0] = _mm256_fmadd_ps(pg, v0, a[g][0]);
      a[g][1] = _mm256_fmadd_ps(pg, v1, a[g][1]);
    }
  }
  for (int g = 0; g < G; ++g) {
    _mm256_storeu_ps(out + g * D, a[g][0]);
    _mm256_storeu_ps(out + g * D + 8, a[g][1]);
  }
}

// out [heads_kv * group][D] = the probabilities p times the value rows (rows[t] + v_offset).
// Keys in tiles that stay in L1 while every (head, 16 floats) slice of them is summed.
template <typename T>
void weighted_values(const float* p, const T* const* rows, int64_t n, int64_t heads_kv, int64_t group,
                     int64_t D, int64_t v_offset, float* out) {
  const int64_t span = heads_kv * D;
  constexpr int64_t TILE = 32;  // 32 rows of SmolLM2's 3 heads: 24 KB in fp32
  for (int64_t t = 0; t < std::min(n, TILE); ++t) prefetch_row(rows[t] + v_offset, span);  // the first tile
  for (int64_t t0 = 0; t0 < n; t0 += TILE) {
    const int64_t t1 = std::min(n, t0 + TILE), t2 = std::min(n, t1 + TILE);
    for (int64_t kvh = 0; kvh < heads_kv; ++kvh) {
      const int64_t h0 = kvh * group;
      if (D % 16 != 0) {  // no 16-float slices: the plain loop
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t g = 0; g < group; ++g) {
            const float pg = p[(h0 + g) * n + t];
            const T* v = rows[t] + v_offset + kvh * D;
            float* o = out + (h0 + g) * D;
            for (int64_t d = 0; d < D; ++d) o[d] += pg * load1(v + d);
          }
        continue;
      }
      for (int64_t d0 = 0; d0 < D; d0 += 16) {
        const int64_t offset = v_offset + kvh * D + d0;
        // The next tile's line of this slice (a 16-element slice of a row is one cache line in
        // fp32, half of one in fp16).
        for (int64_t t = t1; t < t2; ++t) _mm_prefetch(reinterpret_cast<const char*>(rows[t] + offset), _MM_HINT_T0);
        for (int64_t g = 0; g < group; g += 4) {
          const float* pg = p + (h0 + g) * n;
          float* o = out + (h0 + g) * D + d0;
          switch (std::min<int64_t>(4, group - g)) {
            case 4: pv16<4, T>(pg, n, rows, t0, t1, offset, o, D); break;
            case 3: pv16<3, T>(pg, n, rows, t0, t1, offset, o, D); break;
            case 2: pv16<2, T>(pg, n, rows, t0, t1, offset, o, D); break;
            default: pv16<1, T>(pg, n, rows, t0, t1, offset, o, D); break;
          }
        }
      }
    }
  }
}

template <typename T>
torch::Tensor decode_attention_impl(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                                    const torch::Tensor& cache, T* kv, const torch::Tensor& slot_mapping,
                                    const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                    int64_t num_heads, int64_t num_kv_heads, double scale, int64_t window,
                                    const c10::optional<torch::Tensor>& q_norm,
                                    const c10::optional<torch::Tensor>& k_norm, double norm_eps) {
  const int64_t B = qkv.size(0), H = num_heads, KVH = num_kv_heads;
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
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  auto q = torch::empty({B, H, D}, qkv.options());
  float* qr = q.data_ptr<float>();
  std::vector<float> normed(D), k_row(KVH * D);
  auto head = [&](const float* in, const float* norm) -> const float* {  // q or k head before RoPE
    if (norm == nullptr) return in;
    rms_norm_row(in, norm, static_cast<float>(norm_eps), normed.data(), D);
    return normed.data();
  };
  for (int64_t b = 0; b < B; ++b) {  // (q/k norm,) RoPE and the KV write: tiny, serial
    const float* row = x + b * (H + 2 * KVH) * D;
    for (int64_t h = 0; h < H; ++h) rope(head(row + h * D, qn), c + b * D, s + b * D, qr + (b * H + h) * D, D);
    T* k_slot = kv + slots[b] * KVH * D;
    for (int64_t h = 0; h < KVH; ++h) rope(head(row + (H + h) * D, kn), c + b * D, s + b * D, k_row.data() + h * D, D);
    store_row(k_row.data(), k_slot, KVH * D);
    store_row(row + (H + KVH) * D, k_slot + kv_stride, KVH * D);
  }
  auto out = torch::empty({B, H * D}, qkv.options());
  float* o = out.data_ptr<float>();
  // Tasks: (sequence, chunk of CHUNK keys), each over all of the sequence's heads. A task reads a
  // key's rows for every KV head together: the cache holds a token's KVH heads side by side, so it
  // reads its blocks front to back (one head per task read D of every KVH * D floats, which the
  // prefetchers serve badly: SmolLM2, KVH 3, took 1.7x the time for the same bytes). Chunks let one
  // long sequence use every thread (split by KV heads, SmolLM2's 3 kept 2 threads at 1:2). A chunk's
  // unnormalized output, maximum and sum are merged in chunk order below; the chunks depend on the
  // sequence's length only, so its arithmetic is the same whatever the threads or the batch.
  constexpr int64_t CHUNK = 512;
  std::vector<int64_t> first(B + 1, 0);  // first task of each sequence
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[b], start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    first[b + 1] = first[b] + std::max<int64_t>(1, (len - start + CHUNK - 1) / CHUNK);
  }
  const int64_t tasks = first[B];
  // Chunked sequences' partial results: [task][H][D] outputs, [task][H] maxima and sums.
  std::vector<float> part_out, part_max, part_sum;
  if (tasks > B) {
    part_out.resize(tasks * H * D);
    part_max.resize(tasks * H);
    part_sum.resize(tasks * H);
  }
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, maxima(H), sums(H);
    std::vector<const T*> rows;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1;
      const int64_t chunk = task - first[b], chunks = first[b + 1] - first[b], len = lens[b];
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t k0 = start + chunk * CHUNK, n = std::min(len, k0 + CHUNK) - k0;  // this chunk's keys
      float* ot = chunks == 1 ? o + b * H * D : part_out.data() + task * H * D;
      std::fill(ot, ot + H * D, 0.f);
      if (n <= 0) continue;  // NOTE: a decode always sees its own key; kept safe anyway
      // Each key's cache row, walked block by block: no division per key.
      rows.resize(n);
      const int64_t* table = tables + b * max_blocks;
      for (int64_t t = 0, pos = k0; t < n;) {
        const int64_t offset = pos % block_size;
        const T* row = kv + (table[pos / block_size] * block_size + offset) * KVH * D;
        for (int64_t i = offset; i < block_size && t < n; ++i, ++t, ++pos, row += KVH * D) rows[t] = row;
      }
      scores.resize(H * n);
      scores_of(qr + b * H * D, rows.data(), n, KVH, group, D, static_cast<float>(scale), scores.data());
      for (int64_t h = 0; h < H; ++h) sums[h] = exponentiate(scores.data() + h * n, n, &maxima[h]);
      weighted_values(scores.data(), rows.data(), n, KVH, group, D, kv_stride, ot);
      if (chunks == 1) {
        for (int64_t h = 0; h < H; ++h) {
          const float inv = 1.f / sums[h];
          for (int64_t d = 0; d < D; ++d) ot[h * D + d] *= inv;
        }
      } else {
        std::copy(maxima.begin(), maxima.end(), part_max.begin() + task * H);
        std::copy(sums.begin(), sums.end(), part_sum.begin() + task * H);
      }
    }
  });
  for (int64_t b = 0; b < B; ++b) {  // merge the chunks of the chunked sequences, in order
    const int64_t t0 = first[b], t1 = first[b + 1];
    if (t1 - t0 == 1) continue;
    for (int64_t h = 0; h < H; ++h) {
      float mx = -std::numeric_limits<float>::infinity(), total = 0.f;
      for (int64_t t = t0; t < t1; ++t) mx = std::max(mx, part_max[t * H + h]);
      float* oh = o + (b * H + h) * D;
      std::fill(oh, oh + D, 0.f);
      for (int64_t t = t0; t < t1; ++t) {
        const float w = exp_neg(part_max[t * H + h] - mx);
        total += w * part_sum[t * H + h];
        const float* ph = part_out.data() + (t * H + h) * D;
        for (int64_t d = 0; d < D; ++d) oh[d] += w * ph[d];
      }
      const float inv = 1.f / total;
      for (int64_t d = 0; d < D; ++d) oh[d] *= inv;
    }
  }
  return out;
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& cache, const torch::Tensor& slot_mapping,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                               int64_t num_heads, int64_t num_kv_heads, double scale, int64_t window,
                               const c10::optional<torch::Tensor>& q_norm,
                               const c10::optional<torch::Tensor>& k_norm, double norm_eps) {
  TORCH_CHECK(cache.dim() == 5 && cache.is_contiguous(), "cache: contiguous [2, blocks, block_size, KVH, D]");
  if (cache.scalar_type() == torch::kHalf)
    return decode_attention_impl(qkv, cos, sin, cache, reinterpret_cast<half_bits*>(cache.data_ptr<at::Half>()),
                                 slot_mapping, block_tables, seq_lens, num_heads, num_kv_heads, scale, window,
                                 q_norm, k_norm, norm_eps);
  TORCH_CHECK(cache.scalar_type() == torch::kFloat32, "cache: fp32 or fp16");
  return decode_attention_impl(qkv, cos, sin, cache, cache.data_ptr<float>(), slot_mapping, block_tables, seq_lens,
                               num_heads, num_kv_heads, scale, window, q_norm, k_norm, norm_eps);
}
